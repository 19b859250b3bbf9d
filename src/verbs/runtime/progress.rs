//! Progress: where the engine meets the driver, and who runs it.
//!
//! The driver and everything a round needs live in [`Progress`], behind a mutex that is only
//! ever *tried*: holding it is the **progress token**. Whoever holds it runs one round:
//! 1. receive up to [`RX_BATCH`] frames into `handle_frame(now, ..)` (or
//!    `handle_frame_unverified` when the driver cannot see the real IP header), then run
//!    `handle_timeout(now)` when a transport timer is due;
//! 2. run the caller's own engine call (poll a CQ, post a WR) under the same engine lock;
//! 3. drain `poll_transmit` into the driver (frames it cannot take yet wait in a small
//!    backlog) and deliver the engine's events to completion channels;
//! 4. with the engine unlocked, `flush` the driver.
//!
//! Application threads run rounds themselves: polling a CQ (or reading an MR) and posting
//! try the token first, so a busy-polling application receives, answers and transmits in its
//! own thread with no hand-off and no system call but the driver's own (DPDK-style). When the
//! token is taken, the call sets `pending` and the holder runs one more round before it lets
//! go of it, so no posted work is left behind.
//!
//! A post does not always transmit at once. While a poller holds the lease (below), a post
//! only enqueues its WR under the engine lock (no round): the poller's next round builds the
//! frames of every post since, and kicks them out in one system call, and each message then
//! knows whether another follows it, which decides its AckReq. After [`POST_FLUSH_BATCH`]
//! such posts, the next one transmits them all itself. Without a poller, a post transmits in
//! its own round, unless it is deep in a burst (closer than [`POST_BURST_GAP`] to the last,
//! after the burst's first [`BURST_POSTS_SENT_AT_ONCE`]; never on the GSI): then it enqueues
//! as under a lease, every [`POST_FLUSH_BATCH`]th transmits, and the background thread,
//! woken by the first, sends what the burst's end leaves. One post under a lease does
//! transmit at once: a ping-pong's answer, the first post after a poll left its ACK waiting
//! (`Progress::defer_transmit`); its round sends the ACK and the answer in one kick.
//!
//! The background thread ([`run`]) does what nobody polls for: the responder of READ, WRITE
//! and atomics, retransmission timers, applications asleep on a completion channel. A poll
//! takes a **lease** on progress: while it holds, the thread stays out of the poller's way,
//! asleep on the wake-up socket alone, so it never preempts a spinning application. The lease
//! ends when the poller says so (arming a CQ, sleeping on a channel, dropping the CQ:
//! `Runtime::stop_polling`, which wakes the thread at once) or, as a watchdog, when no
//! poll came for [`POLLER_LEASE`]. Otherwise, in wake-up mode the thread sleeps in poll(2) on
//! the driver's fd and the wake-up socket until the next timer; in busy-poll mode it spins on
//! rounds.
//!
//! A device with several engine shards has all of this once per shard: a token, a driver,
//! a background thread. A round that receives a frame for another shard's QP hands it to
//! that shard's inbox (see `Runtime::hand_off`), which the owner drains first in its
//! next round.
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::Duration;

use crate::driver::{wait_readable, Driver, DriverError};
use crate::engine::{
    shard_of_qpn, transmit_buffer_len, CqId, Engine, Event, Instant, Mtu, MAX_FRAME_LEN,
};

use super::{drain, lock, ProgressMode, Runtime, Shard};

/// Frames taken from the driver per round.
pub const RX_BATCH: usize = 64;
/// Frames sent per round before receiving again (keeps ACKs flowing under load).
pub const TX_BATCH: usize = 128;
/// The watchdog of a poller's lease: an application that polled within this long and has not
/// said it stopped is "polling", and the background thread leaves the driver to it. Coarse on
/// purpose: the thread wakes once per lease to look, and each wake-up can preempt a spinning
/// application (at 1 ms, thousands of context switches per second made a busy-poll latency
/// test's 99th percentile 4x its median). Work left by a program that stops polling without
/// arming a CQ or waiting on a channel waits at most this long.
pub const POLLER_LEASE: Duration = Duration::from_millis(20);
/// How long the thread leaves the driver to another thread's round (a post, a poll of
/// memory) when no poller holds a lease.
const TOKEN_BUSY_WAIT: Duration = Duration::from_millis(1);
/// In wake-up mode, how long the thread keeps polling after its last work before it
/// sleeps: a stream of frames (a peer's WRITEs to a responder nobody polls) is then served
/// without a wake-up per burst, and a lone frame costs at most this much spinning.
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// Longest sleep when the driver has no fd to wait on, or the backlog is waiting for room.
const SHORT_WAIT: Duration = Duration::from_micros(200);
/// How often the XDP counters are refreshed while busy (when idle, `Device::xdp_stats` asks
/// for a fresh reading and wakes the thread).
const STATS_PERIOD: Duration = Duration::from_millis(100);
/// `Runtime::thread_wake_at` while the thread is awake.
pub(crate) const THREAD_AWAKE: u64 = 0;
/// `Runtime::thread_wake_at` while the thread leaves the driver to a poller (timers
/// are the poller's then: do not wake it for them).
pub(crate) const THREAD_YIELDING: u64 = 1;
/// `Runtime::thread_wake_at` while the thread sleeps with no timer.
pub(crate) const THREAD_ASLEEP_NO_TIMER: u64 = u64::MAX;

/// Posts that may leave their work requests queued in the engine, untransmitted, for the
/// poller's next round: the next post transmits them all.
pub const POST_FLUSH_BATCH: usize = 32;
/// With no poller, posts closer together than this are a burst.
pub const POST_BURST_GAP: Duration = Duration::from_micros(20);
/// The posts of a burst that transmit themselves, each in its own round, before the rest
/// only enqueue: a short burst (a CM exchange, a few WRs) never waits for a batch.
pub const BURST_POSTS_SENT_AT_ONCE: usize = 16;

/// How long a poller's rounds may leave what the frames they received produced (the ACK of
/// a SEND whose completion the poll hands over, a READ response) for the application's next
/// call, and for how many received frames: a stream of arrivals still gets its ACKs this
/// often, merged.
pub const DEFER_LIMIT: Duration = Duration::from_micros(8);
/// See [`DEFER_LIMIT`].
pub const DEFER_FRAMES: usize = 32;

/// Frames handed to a shard by the shards that received them (see
/// [`Runtime::hand_off`]), with the buffers of frames already handled, for reuse.
#[derive(Default)]
pub(crate) struct Inbox {
    frames: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

impl Inbox {
    /// Most frames an inbox holds: beyond that a frame is dropped, as a full receive ring
    /// drops it (the transport's retry recovers it).
    const LIMIT: usize = 4096;

    pub fn push(&mut self, frame: &[u8]) -> bool {
        if self.frames.len() >= Inbox::LIMIT {
            return false;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.frames.push(buf);
        true
    }
}

/// What a poll reads: a CQ, or memory (how `ib_write_lat` waits for a peer's RDMA WRITE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polled {
    Cq(CqId),
    Memory,
}

/// What the token holder owns: the driver and a round's buffers.
pub(crate) struct Progress {
    driver: Box<dyn Driver>,
    /// The shard this is the token of.
    shard: usize,
    /// Frames taken from the inbox, handled this round, then given back as spares.
    handed: Vec<Vec<u8>>,
    /// Frames handed to the driver since its last flush.
    unflushed: usize,
    /// The buffer to ask `Driver::send_with` for (0: the driver has no transmit memory of
    /// its own, or too little for any frame; every frame is copied from `buf`).
    direct_room: usize,
    /// The last round found no free transmit frame for `send_with`.
    tx_blocked: bool,
    /// Since when poll rounds have left their transmit for the next call, and how many
    /// frames they received meanwhile (see [`DEFER_LIMIT`]).
    deferred: Option<(Instant, usize)>,
    /// The last poll round received frames: the next round learns whether the application
    /// answered them (posted) in between.
    answerable: bool,
    /// The application answers what it receives (it posted between the poll that received
    /// and the next round): only then does a poll leave its ACKs for the answer to carry.
    answering: bool,
    /// What the poll that last handed the application something polled (it returned
    /// completions, or received frames).
    handed_by: Option<Polled>,
    buf: Vec<u8>,
    backlog: VecDeque<Vec<u8>>,
    events: Vec<Event>,
    last_stats: Instant,
    verify: bool,
}

/// What one round did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundOutcome {
    /// Frames received, sent, or timers run.
    pub work: usize,
    /// Frames received.
    pub received: usize,
    /// When the engine next needs a round, from its timers or from a backlog waiting for room.
    pub next_wanted: Option<Instant>,
    /// The round left its transmit for the poller's next call.
    pub deferred: bool,
}

impl Progress {
    pub fn new(driver: Box<dyn Driver>, shard: usize) -> Progress {
        let info = driver.info();
        Progress {
            shard,
            handed: Vec::new(),
            buf: vec![0u8; MAX_FRAME_LEN.max(info.max_frame)],
            unflushed: 0,
            direct_room: {
                let room = driver.send_with_room();
                if room == usize::MAX || room < transmit_buffer_len(Mtu::Mtu256) {
                    0
                } else {
                    room.min(MAX_FRAME_LEN)
                }
            },
            tx_blocked: false,
            deferred: None,
            answerable: false,
            answering: false,
            handed_by: None,
            backlog: VecDeque::new(),
            events: Vec::new(),
            last_stats: Instant::ZERO,
            verify: info.icrc_verifiable,
            driver,
        }
    }

    /// A second handle on the driver's readiness fd, for the background thread to sleep on
    /// without holding the token.
    pub fn wait_fd(&self) -> std::io::Result<Option<OwnedFd>> {
        self.driver
            .wait_fd()
            .map(|fd| fd.try_clone_to_owned())
            .transpose()
    }

    /// One round (see the module comment), running `call` on the engine between receiving
    /// and transmitting. A poll's round (`poll`) that received frames may leave what they
    /// produced for the application's next call (see [`Progress::defer_transmit`]). `Err` is
    /// why the device must stop (a driver failure).
    pub fn round<R>(
        &mut self,
        shared: &Runtime,
        now: Instant,
        poll: Option<Polled>,
        call: impl FnOnce(&mut Engine) -> R,
    ) -> Result<(R, RoundOutcome), String> {
        let shard = &shared.shards[self.shard];
        let (out, mut outcome) = {
            let mut engine = lock(&shard.engine);
            let (received, timers) = self.receive(shared, &mut engine, now)?;
            let completions = engine.completions_polled();
            let out = call(&mut engine);
            let returned = engine.completions_polled() != completions;
            // Only what received frames produced waits, never a post's frames, and only for
            // an application that answers what it receives (a ping-pong, a request and its
            // reply): one that only receives (a stream's sink) would make its sender wait.
            let posts_waiting = shard.posts_waiting.load(Ordering::Relaxed) > 0;
            // Whether the application answers is told by its next post, or by a poll that
            // finds nothing where it last found something. Until then a poll that receives
            // nothing keeps what waits for the answer: one that still hands completions
            // over, or an empty one of another CQ (UCX polls a QP's receive CQ, then its
            // send CQ, before it answers).
            let undecided = poll.is_some()
                && received == 0
                && !posts_waiting
                && self.answerable
                && (returned || poll != self.handed_by);
            if poll.is_some() && (returned || received > 0) {
                self.handed_by = poll;
            }
            let deferred = if undecided {
                self.keep_deferred(now)
            } else {
                if std::mem::take(&mut self.answerable) {
                    self.answering = posts_waiting;
                }
                // Frames that left something to send (an ACK of a request; an ACK received
                // leaves nothing) are what the application may answer.
                self.answerable = poll.is_some() && received > 0 && engine.may_transmit();
                let may = poll.is_some() && self.answering && !posts_waiting;
                self.defer_transmit(may, now, received)
            };
            let sent = if deferred {
                if !shard.transmit_deferred.load(Ordering::Relaxed) {
                    shard.transmit_deferred.store(true, Ordering::Relaxed);
                }
                0
            } else {
                // Under the engine lock: a post that enqueues after this is counted for the
                // next round, whose transmit builds it.
                if shard.posts_waiting.load(Ordering::Relaxed) > 0 {
                    shard.posts_waiting.store(0, Ordering::Relaxed);
                }
                if shard.transmit_deferred.load(Ordering::Relaxed) {
                    shard.transmit_deferred.store(false, Ordering::Relaxed);
                }
                self.transmit(shared, &mut engine, now)
            };
            let work = received + timers + sent;
            while let Some(ev) = engine.poll_event() {
                self.events.push(ev);
            }
            let outcome = RoundOutcome {
                work,
                received,
                next_wanted: engine.poll_timeout(),
                deferred,
            };
            (out, outcome)
        };
        if !self.events.is_empty() {
            shared.dispatch(self.events.drain(..));
        }
        if self.unflushed > 0 {
            shared.stats.kicks.fetch_add(1, Ordering::Relaxed);
        }
        self.unflushed = 0;
        if let Err(e) = self.driver.flush() {
            if !matches!(e, DriverError::TxBusy) {
                return Err(format!("transmit failed: {e}"));
            }
        }
        if !self.backlog.is_empty() || self.tx_blocked {
            let soon = now.checked_add(SHORT_WAIT).unwrap_or(now);
            outcome.next_wanted = Some(outcome.next_wanted.map_or(soon, |t| t.min(soon)));
        }
        self.refresh_xdp_stats(shared, now);
        Ok((out, outcome))
    }

    /// Whether this round leaves the engine's frames for the next call. Only a poll's round
    /// that received frames does (for an application that answers, with no post waiting),
    /// and only within [`DEFER_LIMIT`] and [`DEFER_FRAMES`] of the first round that did: the
    /// application sees its completion before the kernel runs a transmit, and the ACK leaves
    /// with its answer in one kick (the answer's post runs a round that builds and kicks
    /// both: `Runtime::post_answers_deferred_round`). Linux's TCP delays ACKs the same way
    /// in its ping-pong mode. IBTA Vol. 1 9.7.5.1.1 lets a responder acknowledge several
    /// requests with one ACK: ACKs queued meanwhile merge. The next poll that receives
    /// nothing transmits them (one that still hands completions over, or polls another CQ,
    /// waits until [`DEFER_LIMIT`]); so do the calls that change what they depend on (a
    /// QP's modify or destroy, a region's change, a CQ resize:
    /// `Runtime::transmit_waiting_posts`) and the lease's end (`Runtime::stop_polling`, the
    /// background thread at the watchdog).
    fn defer_transmit(&mut self, poll: bool, now: Instant, received: usize) -> bool {
        let may = poll && received > 0 && self.backlog.is_empty() && !self.tx_blocked;
        let defer = may
            && match &mut self.deferred {
                None => {
                    self.deferred = Some((now, received));
                    true
                }
                Some((since, frames)) => {
                    *frames += received;
                    now - *since < DEFER_LIMIT && *frames < DEFER_FRAMES
                }
            };
        if !defer {
            self.deferred = None;
        }
        defer
    }

    /// A poll that leaves the answer undecided (see [`Progress::round`]) keeps a deferral in
    /// force within [`DEFER_LIMIT`] of its start.
    fn keep_deferred(&mut self, now: Instant) -> bool {
        let keep = self.backlog.is_empty()
            && !self.tx_blocked
            && matches!(self.deferred, Some((since, _)) if now - since < DEFER_LIMIT);
        if !keep {
            self.deferred = None;
        }
        keep
    }

    fn receive(
        &mut self,
        shared: &Runtime,
        engine: &mut Engine,
        now: Instant,
    ) -> Result<(usize, usize), String> {
        let verify = self.verify;
        let (me, shards) = (self.shard, shared.shards.len());
        let mut received = self.receive_handed(shared, engine, now);
        received += self
            .driver
            .recv(RX_BATCH, &mut |frame, meta| {
                shared.record(false, frame);
                // Several shards: a frame for another shard's QP goes to that shard (the
                // peer's flow hashed to this queue). Unparsable frames stay: the engine
                // counts why it drops them.
                if shards > 1 {
                    if let Some(qpn) = crate::wire::frame::frame_dest_qpn(frame) {
                        let owner = shard_of_qpn(qpn, shards as u32) as usize;
                        if owner != me {
                            shared.hand_off(owner, frame);
                            return;
                        }
                    }
                }
                if verify && meta.icrc_verifiable {
                    engine.handle_frame(now, frame);
                } else {
                    engine.handle_frame_unverified(now, frame);
                }
            })
            .map_err(|e| format!("receive failed: {e}"))?;
        if received > 0 {
            shared
                .stats
                .rx_frames
                .fetch_add(received as u64, Ordering::Relaxed);
        }
        let mut timers = 0;
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
            timers = 1;
        }
        Ok((received, timers))
    }

    /// Handles the frames other shards handed over and those the device looped back to
    /// itself. Their ICRC is checked when this driver can check its own frames' (the shards
    /// of one device have drivers of one kind).
    fn receive_handed(&mut self, shared: &Runtime, engine: &mut Engine, now: Instant) -> usize {
        let shard = &shared.shards[self.shard];
        // A plain load first: an empty round writes no shared cache line.
        if !shard.inbox_waiting.load(Ordering::Relaxed)
            || !shard.inbox_waiting.swap(false, Ordering::SeqCst)
        {
            return 0;
        }
        std::mem::swap(&mut lock(&shard.inbox).frames, &mut self.handed);
        // A device with a capture has one shard, so what its inbox holds was looped back.
        let looped_only = shared.shards.len() == 1;
        for frame in &self.handed {
            if looped_only {
                self.driver.note_looped_back(frame);
            }
            if self.verify {
                engine.handle_frame(now, frame);
            } else {
                engine.handle_frame_unverified(now, frame);
            }
        }
        let n = self.handed.len();
        lock(&shard.inbox).spare.append(&mut self.handed);
        n
    }

    fn transmit(&mut self, shared: &Runtime, engine: &mut Engine, now: Instant) -> usize {
        let mut work = 0;
        // Older frames first, then new ones while the driver has room.
        while let Some(frame) = self.backlog.front() {
            match self.driver.send(frame) {
                Ok(()) => {
                    self.backlog.pop_front();
                    self.unflushed += 1;
                    work += 1;
                }
                Err(DriverError::TxBusy) => break,
                Err(_) => {
                    self.backlog.pop_front();
                    shared.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut sent = 0;
        self.tx_blocked = false;
        // The engine's queue ends the loop: a round with nothing queued (most busy-poll
        // rounds) and the last frame's kick take no transmit buffer only to give it back.
        while self.backlog.is_empty() && sent < TX_BATCH && engine.may_transmit() {
            // Straight into the driver's transmit memory (AF_XDP: a UMEM frame) when the
            // frame fits there: the engine's one copy out of the MR is the only copy.
            if self.direct_room > 0 {
                let mut looped = false;
                let me = self.shard;
                let written = self.driver.send_with(self.direct_room, &mut |frame| {
                    let len = engine.poll_transmit(now, frame)?;
                    shared.record(true, &frame[..len]);
                    if let Some(to) = shared.loopback_shard(me, &frame[..len]) {
                        // Not for the link: the driver takes its buffer back unsent.
                        shared.loop_back(me, to, &frame[..len]);
                        looped = true;
                        return None;
                    }
                    Some(len)
                });
                match written {
                    Ok(None) if looped => {
                        sent += 1;
                        continue;
                    }
                    Ok(Some(_)) => {
                        sent += 1;
                        self.unflushed += 1;
                        shared.stats.tx_frames.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // Nothing to send, or a frame larger than the room (path MTU 4096 on
                    // 4 KiB chunks): the copy path below takes it.
                    Ok(None) => {}
                    // No free frame: nothing was written; try again next round.
                    Err(DriverError::TxBusy) => {
                        self.tx_blocked = true;
                        break;
                    }
                    Err(e) => {
                        sent += 1;
                        shared.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                        engine.report_send_failure(&e.to_string());
                        continue;
                    }
                }
            }
            let Some(len) = engine.poll_transmit(now, &mut self.buf) else {
                break;
            };
            sent += 1;
            let frame = &self.buf[..len];
            shared.record(true, frame);
            if let Some(to) = shared.loopback_shard(self.shard, frame) {
                shared.loop_back(self.shard, to, frame);
                continue;
            }
            match self.driver.send(frame) {
                Ok(()) => {
                    self.unflushed += 1;
                    shared.stats.tx_frames.fetch_add(1, Ordering::Relaxed);
                }
                Err(DriverError::TxBusy) => self.backlog.push_back(frame.to_vec()),
                // A frame the driver refuses is lost like a frame lost on the wire (RC
                // retries it), but the engine learns of it: a UD send completes with an
                // error instead of success.
                Err(e) => {
                    shared.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                    engine.report_send_failure(&e.to_string());
                }
            }
        }
        work + sent
    }

    fn refresh_xdp_stats(&mut self, shared: &Runtime, now: Instant) {
        // The XDP program's counters are the interface's: shard 0 reads them.
        if self.shard != 0 {
            return;
        }
        let wanted = shared.xdp_stats_wanted.load(Ordering::Relaxed)
            && shared.xdp_stats_wanted.swap(false, Ordering::SeqCst);
        if wanted || now - self.last_stats >= STATS_PERIOD {
            self.last_stats = now;
            if let Some(stats) = self.driver.xdp_stats() {
                *lock(&shared.xdp_stats) = Some(stats);
            }
            shared.xdp_stats_generation.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Takes the progress token if nobody holds it.
pub(crate) fn try_token(shard: &Shard) -> Option<std::sync::MutexGuard<'_, Progress>> {
    match shard.progress.try_lock() {
        Ok(guard) => Some(guard),
        // A round that panicked leaves the driver in a usable state (the device is marked
        // stopped anyway).
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The background progress thread.
pub(crate) fn run(shared: Arc<Runtime>, index: usize, waker: UnixDatagram) {
    let shard = &shared.shards[index];
    let driver_fd = match lock(&shard.progress).wait_fd() {
        Ok(fd) => fd,
        Err(e) => {
            fail(&shared, format!("duplicating the driver's fd failed: {e}"));
            return;
        }
    };
    let mut last_work = Instant::ZERO;
    while !shared.stop.load(Ordering::SeqCst) {
        if shared.check_alive().is_err() {
            return;
        }
        let now = shared.now();
        let stats_wanted = index == 0 && shared.xdp_stats_wanted.load(Ordering::SeqCst);
        let lease_left = shared.poller_lease_left(index, now);
        let poller = lease_left.is_some() && !stats_wanted;
        let mut outcome = None;
        if !poller {
            if let Some(mut progress) = try_token(shard) {
                shard.pending.store(false, Ordering::SeqCst);
                match progress.round(&shared, now, None, |_| ()) {
                    Ok(((), o)) => outcome = Some(o),
                    Err(reason) => {
                        drop(progress);
                        fail(&shared, reason);
                        return;
                    }
                }
            }
        }
        // (While yielding, `pending` is the token holder's to serve.)
        if outcome.is_some_and(|o| o.work > 0)
            || (outcome.is_some() && shard.pending.load(Ordering::SeqCst))
        {
            last_work = now;
            continue;
        }
        // Someone else holds the token or polls: leave the driver to them for a while.
        let yielding = outcome.is_none();
        if !yielding
            && (shared.progress_mode == ProgressMode::BusyPoll
                || now - last_work < SPIN_BEFORE_SLEEP)
        {
            std::hint::spin_loop();
            continue;
        }
        let next_wanted = outcome.and_then(|o| o.next_wanted);
        let mut timeout = next_wanted.map(|t| t.saturating_duration_since(shared.now()));
        let mut fds = vec![waker.as_fd()];
        if yielding {
            // A poller's lease: look again when its watchdog would end it (the poller's
            // rounds run the timers meanwhile). A busy token without a poller: shortly.
            timeout = Some(match lease_left {
                Some(left) if poller => left,
                _ => timeout.map_or(TOKEN_BUSY_WAIT, |t| t.min(TOKEN_BUSY_WAIT)),
            });
        } else {
            match &driver_fd {
                Some(fd) => fds.push(fd.as_fd()),
                None => timeout = Some(timeout.map_or(SHORT_WAIT, |t| t.min(SHORT_WAIT))),
            }
        }
        // Say when we will look again, then look once more for work that a poller's round
        // left (it reads `thread_wake_at` after arming its timers, so one of us sees it).
        let wake_at = match timeout {
            _ if yielding => THREAD_YIELDING,
            Some(t) => shared
                .now()
                .checked_add(t)
                .map_or(THREAD_ASLEEP_NO_TIMER, |i| i.as_nanos().max(2)),
            None => THREAD_ASLEEP_NO_TIMER,
        };
        shard.thread_wake_at.store(wake_at, Ordering::SeqCst);
        let earlier_timer = lock(&shard.engine)
            .poll_timeout()
            .is_some_and(|t| t.as_nanos() < wake_at);
        if !yielding && (shard.pending.load(Ordering::SeqCst) || earlier_timer) {
            shard.thread_wake_at.store(THREAD_AWAKE, Ordering::SeqCst);
            continue;
        }
        shared.stats.sleeps.fetch_add(1, Ordering::Relaxed);
        let waited = wait_readable(&fds, timeout);
        shard.thread_wake_at.store(THREAD_AWAKE, Ordering::SeqCst);
        if let Err(e) = waited {
            fail(&shared, format!("poll failed: {e}"));
            return;
        }
        drain(&waker);
    }
}

/// Records why progress stops (a driver error or a panic), then wakes every completion
/// channel so callers blocked in `get_cq_event` learn it; every later verbs call (posts,
/// polls, waits) returns `DeviceStopped` with this reason.
pub(crate) fn fail(shared: &Runtime, reason: String) {
    tracing::error!(device = %shared.name, %reason, "progress stopped");
    {
        let mut stopped = lock(&shared.stopped);
        if stopped.is_some() {
            return;
        }
        *stopped = Some(reason);
    }
    shared.stopped_flag.store(true, Ordering::SeqCst);
    for shard in &shared.shards {
        let _ = shard.waker.send(&[1]);
    }
    let channels: Vec<_> = lock(&shared.all_channels)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    for channel in channels {
        channel.wake();
    }
    shared.async_events.wake();
}
