//! The runtime under the verbs handles: a device's state shared by its handles and its
//! background threads (the engine shards behind their locks, the interface facts, wake-up
//! sockets, completion channels, counters and traces), driving a round ([`progress`]: the
//! progress token, the background thread), and the device's asynchronous events
//! ([`events`]). The handles (`Device`, `Pd`, `Cq`, `Qp`, `Srq`, ...) reach it through one
//! path: their device's `Core::runtime`.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::driver::{DriverInfo, XdpStats};
use crate::engine::{CqId, Engine, Event};
use crate::netdev::{GidEntry, MacAddr, NetdevInfo};

use super::error::{Result, VerbsError};
use events::AsyncQueue;

pub(crate) mod events;
pub(crate) mod progress;

pub(crate) use progress::Polled;

/// How the background progress thread waits for work when no application thread polls
/// (a thread that polls a CQ makes progress itself in either mode: see [`progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Sleep in poll(2) on the driver's fd and a wake-up fd until a frame arrives or the
    /// next transport timer is due. Low CPU use; the right mode for applications that poll
    /// their CQs (they drive progress) or sleep on completion channels, and for any machine
    /// with fewer spare cores than busy threads.
    #[default]
    Wakeup,
    /// Never sleep while nobody polls: spin on the driver. The responder (READ, WRITE,
    /// atomics) answers without a wake-up, at the cost of one core at 100%; right only when
    /// a core is spare for it.
    BusyPoll,
}

impl ProgressMode {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: [ProgressMode; 2] = [ProgressMode::Wakeup, ProgressMode::BusyPoll];

    /// The name `--progress` takes.
    pub fn name(self) -> &'static str {
        match self {
            ProgressMode::Wakeup => "wakeup",
            ProgressMode::BusyPoll => "busy-poll",
        }
    }

    /// One line for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            ProgressMode::Wakeup => {
                "the background thread sleeps until a frame or a timer; polling threads drive progress"
            }
            ProgressMode::BusyPoll => {
                "the background thread spins while nobody polls (one core at 100%)"
            }
        }
    }
}

impl std::fmt::Display for ProgressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ProgressMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        ProgressMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown progress mode {s:?}: choose wakeup or busy-poll"))
    }
}

/// One frame seen by the progress thread (see [`DeviceConfig::trace_frames`]).
#[derive(Clone, Debug)]
pub struct TracedFrame {
    /// Time since the device was opened.
    pub at: Duration,
    /// True if sent by this device, false if received.
    pub outgoing: bool,
    /// The whole Ethernet frame.
    pub bytes: Vec<u8>,
}

/// Counters of the progress thread (the engine's own counters are [`Device::counters`]).
#[derive(Debug, Default)]
pub struct ProgressStats {
    /// Frames handed to the engine.
    pub rx_frames: AtomicU64,
    /// Frames the engine produced and the driver accepted.
    pub tx_frames: AtomicU64,
    /// Frames the driver refused (counted, then dropped: the transport retries).
    pub tx_errors: AtomicU64,
    /// Flushes that handed queued frames to the link (on AF_XDP and UDP, a system call
    /// each): `tx_frames / kicks` is how many frames one kick carries.
    pub kicks: AtomicU64,
    /// Loop iterations that went to sleep.
    pub sleeps: AtomicU64,
    /// Wake-up writes to the background thread (one system call each): an application's
    /// round armed a timer earlier than the sleeping thread would look, a poller went to
    /// sleep on a completion channel, or a burst's batched post found it asleep.
    pub wakeups: AtomicU64,
    /// Posts with nobody polling that only enqueued their WRs for their burst's batch
    /// (`BURST_POSTS_SENT_AT_ONCE`): every other post transmits in its own call, or leaves
    /// its WR for a poller's next round.
    pub batched_posts: AtomicU64,
    /// Rounds run by application threads (polls, posts) instead of the background thread.
    pub driven_rounds: AtomicU64,
    /// Poll rounds that left what the frames they received produced (ACKs) for the
    /// application's answer to carry (`progress::DEFER_LIMIT`): only a program that answers
    /// what it receives has them.
    pub deferred_rounds: AtomicU64,
    /// Frames a shard received for a QP of another shard and handed to it (a device with
    /// several shards; each costs a copy).
    pub handed_off_frames: AtomicU64,
    /// Of `rx_frames`, those received in rounds of application threads.
    pub driven_rx_frames: AtomicU64,
    /// Frames the engine sent to one of the device's own addresses, handed straight back to
    /// the shard of their QP instead of the driver (loopback: they never reach the link).
    pub looped_back_frames: AtomicU64,
}

/// A device's state, shared by its user-facing handles and its progress thread: the engine
/// behind its lock, the interface facts, the wake-up socket, channels, counters and traces.
pub(crate) struct Runtime {
    pub name: String,
    /// UDP driver: the one address its socket sends from (the only usable source GID).
    pub udp_source: Option<IpAddr>,
    /// The engine shards (at least one): see [`DeviceConfig::shards`].
    pub shards: Vec<Shard>,
    /// The shard the next CQ is placed on (round robin).
    pub next_cq_shard: AtomicUsize,
    pub start: Instant,
    pub progress_mode: ProgressMode,
    pub stop: AtomicBool,
    /// Set when progress stopped for good (a driver failure, a panic): why.
    pub stopped: Mutex<Option<String>>,
    /// `stopped` is set (checked on every call without taking its lock).
    pub stopped_flag: AtomicBool,
    pub netdev: NetdevInfo,
    pub gid_table: Vec<GidEntry>,
    pub driver_info: DriverInfo,
    pub neighbour_timeout: Duration,
    pub static_neighbours: Mutex<HashMap<IpAddr, MacAddr>>,
    /// Completion channel of each CQ that has one, by CQ id.
    pub channels: Mutex<HashMap<u32, Arc<ChannelShared>>>,
    /// Every completion channel of the device (with or without CQs), to wake its waiters
    /// when the progress thread stops.
    pub all_channels: Mutex<Vec<Weak<ChannelShared>>>,
    /// Asynchronous events (QP fatal, CQ error, port active/error, ...) and their fd.
    pub async_events: AsyncQueue,
    /// The device's own addresses (its GIDs): frames to them are looped back.
    pub local_ips: Vec<IpAddr>,
    /// The QPN prefix of the device's engines ([`Driver::qpn_prefix`]): a frame to an own
    /// address whose QPN has another prefix belongs to another process on the interface,
    /// and goes to the driver (the relay), not back to this device.
    pub qpn_prefix: Option<u8>,
    /// The relay the device goes through, and its slot ([`Driver::relay_endpoint`]).
    pub relay: Option<crate::driver::relay::RelayEndpoint>,
    pub stats: ProgressStats,
    pub xdp_stats: Mutex<Option<XdpStats>>,
    /// Set by [`Device::xdp_stats`] to ask the progress thread for fresh counters.
    pub xdp_stats_wanted: AtomicBool,
    /// Bumped by the progress thread each time it refreshed `xdp_stats`.
    pub xdp_stats_generation: AtomicU64,
    pub trace_limit: usize,
    pub trace: Mutex<VecDeque<TracedFrame>>,
    /// Live objects of each kind, against the device limits.
    pub objects: [AtomicU32; 7],
}

/// One engine shard of a device: its engine, its progress token (with its driver) and its
/// background thread's state. Shards share the device's objects through the engine's tables
/// and nothing else, so threads working on different shards never wait for each other.
pub(crate) struct Shard {
    pub engine: Mutex<Engine>,
    /// The progress token: the driver and a round's buffers (only ever `try_lock`ed; see
    /// [`progress`]). Lock order: this, then `engine`.
    pub progress: Mutex<progress::Progress>,
    /// Work was posted while someone else held the token: its holder runs one more round.
    pub pending: AtomicBool,
    /// When an application thread last polled (engine clock, ns; 0 = nobody polls).
    pub poller_seen: AtomicU64,
    /// Posts that only enqueued their WRs since the last round that transmitted.
    pub posts_waiting: AtomicUsize,
    /// When work was last posted with no poller (engine clock, ns; 0 = never).
    pub last_post: AtomicU64,
    /// Posts in the burst `last_post` belongs to (posts closer than
    /// [`progress::POST_BURST_GAP`] with no poller).
    pub burst_posts: AtomicUsize,
    /// A poll's round left what the frames it received produced (an ACK) for the next call
    /// (`progress::DEFER_LIMIT`).
    pub transmit_deferred: AtomicBool,
    /// When the sleeping background thread looks again (engine clock, ns), or
    /// `THREAD_AWAKE` / `THREAD_YIELDING` / `THREAD_ASLEEP_NO_TIMER`.
    pub thread_wake_at: AtomicU64,
    /// Writing a byte wakes the shard's background thread.
    pub waker: UnixDatagram,
    /// Frames other shards received for this shard's QPs.
    pub inbox: Mutex<progress::Inbox>,
    /// `inbox` has frames (checked by every round without taking its lock).
    pub inbox_waiting: AtomicBool,
}

thread_local! {
    /// The device whose poller's lease this thread holds ([`Runtime::hold_lease`]).
    static LEASE_HOLDER: std::cell::RefCell<Weak<Runtime>> =
        const { std::cell::RefCell::new(Weak::new()) };
}

/// Who transmits a post that only enqueued, unless a batch's worth waits
/// ([`Runtime::enqueue_post`]).
enum WaitingPostFor {
    /// The poller's next round (the background thread only once the lease ends).
    Poller,
    /// The background thread, woken now if it sleeps (a burst with nobody polling).
    Thread,
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data valid.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runtime {
    /// The engine's clock: time since the device was opened.
    pub fn now(&self) -> crate::engine::Instant {
        crate::engine::Instant::from_elapsed(self.start.elapsed())
    }

    /// Runs `f` on the engine of shard `shard`, then delivers the events it raised. With
    /// `posted` (`f` posted work or changed a QP's state), sees that what it produced is
    /// transmitted: by a round of this thread when the shard's progress token is free, else
    /// by one more round of the token's holder, or (a post that only enqueues) by the
    /// poller's next round.
    pub fn with_engine<R>(
        &self,
        shard: usize,
        posted: bool,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        if !posted {
            self.check_alive()?;
            return Ok(self.on_engine_alone(shard, f));
        }
        self.engine_work(shard, false, f)
    }

    /// [`Runtime::with_engine`] for a post of send WRs that may join a burst: with no poller,
    /// a post that follows the last within [`progress::POST_BURST_GAP`], beyond the burst's
    /// first [`progress::BURST_POSTS_SENT_AT_ONCE`], only enqueues, and the burst leaves in
    /// batches (see [`Runtime::post_joins_burst`]). The GSI's posts (the CM's MADs) never
    /// wait so.
    pub fn post_to_engine<R>(
        &self,
        shard: usize,
        may_join_burst: bool,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        self.engine_work(shard, may_join_burst, f)
    }

    fn engine_work<R>(
        &self,
        shard: usize,
        may_join_burst: bool,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        self.check_alive()?;
        let s = &self.shards[shard];
        // One clock read per post (none for a call that posts nothing: a receive WR).
        let now = self.now();
        if may_join_burst && self.post_joins_burst(shard, now) {
            self.stats.batched_posts.fetch_add(1, Ordering::Relaxed);
            return self.enqueue_post(shard, now, WaitingPostFor::Thread, f);
        }
        if self.post_left_for_poller(shard, now) {
            if !self.post_answers_deferred_round(shard) {
                return self.enqueue_post(shard, now, WaitingPostFor::Poller, f);
            }
            // The answer a poll left its ACK for: counted as a waiting post, which tells the
            // round that the application answers, and sent with the ACK in this call's round.
            s.posts_waiting.fetch_add(1, Ordering::Relaxed);
        }
        let f = match self.drive(shard, now, None, f)? {
            // A free token: the post is the call of this thread's round, which transmits what
            // it produced (one engine lock for both).
            Ok(out) => return Ok(out),
            Err(f) => f,
        };
        let out = self.on_engine_alone(shard, f);
        // The token was busy. After `f`: a holder that clears `pending` from now on sees the
        // posted work.
        s.pending.store(true, Ordering::SeqCst);
        // Still busy: its holder runs the round `pending` asks for.
        let _ = self.drive(shard, self.now(), None, |_| ())?;
        Ok(out)
    }

    /// [`Runtime::transmit_waiting_posts`] on every shard: before a region changes or goes,
    /// the READ responses a poll left queued are built from it as it was.
    pub fn transmit_all_waiting(&self) -> Result<()> {
        for shard in 0..self.shards.len() {
            self.transmit_waiting_posts(shard)?;
        }
        Ok(())
    }

    /// Transmits what posts (and a poll's deferred round) left in shard `shard`'s engine for
    /// a poller, unless another thread holds the token (its round does). A call that counts
    /// completions (resizing a CQ) then sees what those posts did, as if each had transmitted
    /// itself: a UD send completes when its frame is built.
    pub fn transmit_waiting_posts(&self, shard: usize) -> Result<()> {
        let s = &self.shards[shard];
        if s.pending.load(Ordering::Relaxed)
            || s.posts_waiting.load(Ordering::Relaxed) > 0
            || s.transmit_deferred.load(Ordering::Relaxed)
        {
            let _ = self.drive(shard, self.now(), None, |_| ())?;
        }
        Ok(())
    }

    /// Whether what a post produces is left for the poller (renewing its lease). With a poller
    /// active, its next poll transmits the posted work with that of other posts: one system call per batch instead of one per
    /// post. Posting renews the lease, so a long burst of posts (16 QPs x 128 WRs) stays one
    /// batch however long it takes; a program that posts and never polls again is served by
    /// the watchdog one lease after its last post. Without a poller the post transmits
    /// itself: no wake-up of another thread stands between it and the wire (handing a burst
    /// to the background thread was tried: under load its wake-up held the second of two CM
    /// REQs for 1.7 ms, and perftest -R's server lost track of the connection).
    fn post_left_for_poller(&self, shard: usize, now: crate::engine::Instant) -> bool {
        if !self.poller_active(shard, now) {
            return false;
        }
        self.shards[shard]
            .poller_seen
            .store(now.as_nanos().max(1), Ordering::Relaxed);
        true
    }

    /// Whether a post under a lease is a ping-pong's answer: a poll's round left what the
    /// frames it received produced (the ACK) for the application's answer
    /// (`transmit_deferred`), and no post has joined it yet. The answer then transmits both
    /// in its own round, as a hardware HCA rings its doorbell at the post, instead of waiting
    /// for the next poll: the kick leaves one poll round (a look at the receive ring, the
    /// CQ, the deferral's bookkeeping) sooner. The answer's further posts only enqueue.
    fn post_answers_deferred_round(&self, shard: usize) -> bool {
        let s = &self.shards[shard];
        s.transmit_deferred.load(Ordering::Relaxed) && s.posts_waiting.load(Ordering::Relaxed) == 0
    }

    /// A post that only enqueues (no round): its WR waits in the engine, its frames built
    /// later with those of the posts around it, in one kick. Once [`progress::POST_FLUSH_BATCH`]
    /// wait, this post transmits them (here, or in the token holder's next round); else
    /// `waiting_for` does.
    fn enqueue_post<R>(
        &self,
        shard: usize,
        now: crate::engine::Instant,
        waiting_for: WaitingPostFor,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        let s = &self.shards[shard];
        let out = self.on_engine_alone(shard, f);
        let waiting = s.posts_waiting.fetch_add(1, Ordering::Relaxed) + 1;
        if waiting >= progress::POST_FLUSH_BATCH {
            s.pending.store(true, Ordering::SeqCst);
            let _ = self.drive(shard, self.now(), None, |_| ())?;
            return Ok(out);
        }
        match waiting_for {
            WaitingPostFor::Poller => {
                // Should the poller never poll again, the background thread sends it when the
                // lease ends, even one asleep without a timer (no frame was built, so none was
                // armed).
                let lease_end = now.checked_add(progress::POLLER_LEASE).unwrap_or(now);
                self.wake_if_asleep_past(shard, lease_end);
            }
            WaitingPostFor::Thread => {
                // The thread's next round sends the burst's tail: `pending` keeps an awake
                // thread from going to sleep past it.
                s.pending.store(true, Ordering::SeqCst);
                self.wake_if_asleep_past(shard, now);
            }
        }
        Ok(out)
    }

    /// Whether a post with no poller is deep enough in a burst to only enqueue: it follows
    /// the shard's last such post within [`progress::POST_BURST_GAP`], after the burst's
    /// first [`progress::BURST_POSTS_SENT_AT_ONCE`], each of which transmitted itself. A
    /// burst of posts before the first poll (perftest's first window on 1,024 QPs) then
    /// leaves [`progress::POST_FLUSH_BATCH`] WRs per kick instead of one, while a lone post,
    /// or a short burst (two CM REQs), never waits for another thread's wake-up (handing
    /// every burst to the background thread from its second post was tried: under load the
    /// wake-up held the second of two CM REQs for 1.7 ms).
    fn post_joins_burst(&self, shard: usize, now: crate::engine::Instant) -> bool {
        if self.poller_active(shard, now) {
            return false;
        }
        let s = &self.shards[shard];
        let previous = s.last_post.swap(now.as_nanos().max(1), Ordering::Relaxed);
        let in_burst = previous != 0
            && now.as_nanos().saturating_sub(previous) < progress::POST_BURST_GAP.as_nanos() as u64;
        if !in_burst {
            s.burst_posts.store(1, Ordering::Relaxed);
            return false;
        }
        s.burst_posts.fetch_add(1, Ordering::Relaxed) + 1 > progress::BURST_POSTS_SENT_AT_ONCE
    }

    /// Runs `f` under the engine lock alone (no round), then delivers its events.
    fn on_engine_alone<R>(&self, shard: usize, f: impl FnOnce(&mut Engine) -> R) -> R {
        let (out, events) = {
            let mut engine = lock(&self.shards[shard].engine);
            let out = f(&mut engine);
            let mut events = Vec::new();
            while let Some(ev) = engine.poll_event() {
                events.push(ev);
            }
            (out, events)
        };
        self.dispatch(events);
        out
    }

    /// Runs `f` (a poll of a CQ or of memory) on the engine of shard `shard` inside a
    /// progress round of this thread when its token is free, so what arrived is received,
    /// answered and completed here and now; marks this thread as the shard's poller, so the
    /// background thread stays away.
    pub fn poll_engine<R>(
        &self,
        shard: usize,
        polled: Polled,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        self.check_alive()?;
        let now = self.now();
        self.shards[shard]
            .poller_seen
            .store(now.as_nanos().max(1), Ordering::Relaxed);
        match self.drive(shard, now, Some(polled), f)? {
            Ok(out) => Ok(out),
            // Someone else is running a round: read what has arrived so far.
            Err(f) => self.with_engine(shard, false, f),
        }
    }

    /// A poll that runs a round on each shard of `shards` (a bit per shard) when its token
    /// is free, then `f` on the engine of `home` (in its round): for a CQ whose QPs live on
    /// several shards, or memory any shard may write.
    pub fn poll_shards<R>(
        &self,
        shards: u64,
        home: usize,
        polled: Polled,
        f: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        for shard in (0..self.shards.len()).filter(|&i| i != home && shards & (1 << i) != 0) {
            let now = self.now();
            self.shards[shard]
                .poller_seen
                .store(now.as_nanos().max(1), Ordering::Relaxed);
            let _ = self.drive(shard, now, Some(polled), |_| ())?;
        }
        self.poll_engine(home, polled, f)
    }

    /// Every shard, as a bit set for [`Runtime::poll_shards`].
    pub fn all_shards(&self) -> u64 {
        u64::MAX >> (64 - self.shards.len())
    }

    /// This thread stops polling (it is going to sleep on a completion channel, arms a CQ or
    /// drops one): the poller's lease ends, and the background threads take their drivers
    /// back at once instead of when the lease's watchdog ([`progress::POLLER_LEASE`]) would.
    pub fn stop_polling(&self) {
        for (index, s) in self.shards.iter().enumerate() {
            if s.poller_seen.swap(0, Ordering::Relaxed) != 0 {
                // Kick out what posts and polls left queued for this poller's next call.
                let _ = self.drive(index, self.now(), None, |_| ());
                if s.thread_wake_at.load(Ordering::SeqCst) == progress::THREAD_YIELDING {
                    self.wake(index);
                }
            }
        }
    }

    /// This thread is going into the connection manager (a wait for its events): it is not
    /// polling, so the lease it holds ends now, and what its polls left for its next call (an
    /// ACK) goes out first. (The peer may wait for that ACK before its next step: perftest's
    /// server listens for the test QPs only once its last sync SEND is acknowledged.)
    pub fn end_this_threads_lease() {
        let held = LEASE_HOLDER
            .try_with(|held| std::mem::take(&mut *held.borrow_mut()))
            .ok()
            .and_then(|held| held.upgrade());
        if let Some(device) = held {
            device.stop_polling();
        }
    }

    /// This thread is about to poll `self`. A thread holds one device's lease at a time: a
    /// lease it held on another device ends now, so a thread that drives two devices in turn
    /// (both ends of a test, a program with two contexts) never leaves one of them unserved
    /// until the watchdog.
    pub fn hold_lease(self: &Arc<Self>) {
        let previous = LEASE_HOLDER.try_with(|held| {
            let mut held = held.borrow_mut();
            if std::ptr::eq(held.as_ptr(), Arc::as_ptr(self)) {
                return None;
            }
            Some(std::mem::replace(&mut *held, Arc::downgrade(self)))
        });
        if let Ok(Some(previous)) = previous {
            if let Some(previous) = previous.upgrade() {
                previous.stop_polling();
            }
        }
    }

    /// Whether an application thread holds a poller's lease on shard `shard`: it polled
    /// within [`progress::POLLER_LEASE`] of `now` and has not stopped polling since.
    pub fn poller_active(&self, shard: usize, now: crate::engine::Instant) -> bool {
        self.poller_lease_left(shard, now).is_some()
    }

    /// How long the poller's lease on shard `shard` runs from `now` unless it polls again;
    /// `None` without a lease.
    pub fn poller_lease_left(
        &self,
        shard: usize,
        now: crate::engine::Instant,
    ) -> Option<std::time::Duration> {
        let seen = self.shards[shard].poller_seen.load(Ordering::Relaxed);
        let since = now.as_nanos().saturating_sub(seen);
        let lease = progress::POLLER_LEASE.as_nanos() as u64;
        (seen != 0 && since < lease).then(|| std::time::Duration::from_nanos(lease - since))
    }

    /// Runs `call` in a progress round of this thread on shard `shard` if its token is free,
    /// then the rounds that work posted meanwhile (`pending`) asks for. `Ok(Err(call))`:
    /// someone else holds the token (and will run the round `pending` asks for).
    fn drive<R, F: FnOnce(&mut Engine) -> R>(
        &self,
        shard: usize,
        now: crate::engine::Instant,
        poll: Option<Polled>,
        call: F,
    ) -> Result<std::result::Result<R, F>> {
        let s = &self.shards[shard];
        let Some(mut token) = progress::try_token(s) else {
            return Ok(Err(call));
        };
        // Cleared only when set: a round nobody asked for writes no shared cache line. (Set
        // after the load, it is seen by the check after the round.)
        if s.pending.load(Ordering::Relaxed) {
            s.pending.store(false, Ordering::SeqCst);
        }
        let out = self.driven_round(shard, &mut token, now, poll, call);
        drop(token);
        let out = out?;
        while s.pending.load(Ordering::SeqCst) {
            let Some(mut token) = progress::try_token(s) else {
                break;
            };
            s.pending.store(false, Ordering::SeqCst);
            let done = self.driven_round(shard, &mut token, self.now(), None, |_| ());
            drop(token);
            done?;
        }
        Ok(Ok(out))
    }

    /// One round in an application thread. A panic in it (an engine or driver bug) stops
    /// the device as a panic of the background thread does, and this call fails.
    fn driven_round<R>(
        &self,
        shard: usize,
        token: &mut progress::Progress,
        now: crate::engine::Instant,
        poll: Option<Polled>,
        call: impl FnOnce(&mut Engine) -> R,
    ) -> Result<R> {
        let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            token.round(self, now, poll, call)
        }));
        let (out, outcome) = match round {
            Ok(Ok(done)) => done,
            Ok(Err(reason)) => return Err(self.stop_with(reason)),
            Err(panic) => {
                return Err(
                    self.stop_with(format!("progress round panicked: {}", panic_text(&*panic)))
                )
            }
        };
        self.stats.driven_rounds.fetch_add(1, Ordering::Relaxed);
        if outcome.received > 0 {
            self.stats
                .driven_rx_frames
                .fetch_add(outcome.received as u64, Ordering::Relaxed);
        }
        // A timer armed earlier than the sleeping thread would look: wake it.
        if let Some(t) = outcome.next_wanted {
            self.wake_if_asleep_past(shard, t);
        }
        // Should the poller never call again, the background thread sends what its round
        // left when the lease ends.
        if outcome.deferred {
            self.stats.deferred_rounds.fetch_add(1, Ordering::Relaxed);
            let lease_end = now.checked_add(progress::POLLER_LEASE).unwrap_or(now);
            self.wake_if_asleep_past(shard, lease_end);
        }
        Ok(out)
    }

    /// Wakes shard `shard`'s background thread if it sleeps and would look only after `t`
    /// (not while it is awake, nor while it yields to a poller, whose rounds serve `t`).
    fn wake_if_asleep_past(&self, shard: usize, t: crate::engine::Instant) {
        let wake_at = self.shards[shard].thread_wake_at.load(Ordering::SeqCst);
        if wake_at != progress::THREAD_AWAKE
            && wake_at != progress::THREAD_YIELDING
            && t.as_nanos() < wake_at
        {
            self.wake(shard);
        }
    }

    /// Stops the device for `reason` (unless it stopped already) and returns the error
    /// every later call gets.
    fn stop_with(&self, reason: String) -> VerbsError {
        progress::fail(self, reason);
        let reason = lock(&self.stopped).clone().unwrap_or_default();
        VerbsError::DeviceStopped {
            device: self.name.clone(),
            reason,
        }
    }

    /// `Err(DeviceStopped)` with the cause once progress has stopped for good.
    pub fn check_alive(&self) -> Result<()> {
        if !self.stopped_flag.load(Ordering::Relaxed) {
            return Ok(());
        }
        match lock(&self.stopped).clone() {
            Some(reason) => Err(VerbsError::DeviceStopped {
                device: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Wakes the background progress thread of shard `shard` (one system call).
    pub fn wake(&self, shard: usize) {
        self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        // A full socket buffer already means "readable": ignore WouldBlock.
        let _ = self.shards[shard].waker.send(&[1]);
    }

    /// Gives shard `to` a frame this shard received for one of its QPs, and makes sure it
    /// looks soon: its poller's next round, or its background thread, woken if asleep.
    pub fn hand_off(&self, to: usize, frame: &[u8]) {
        self.stats.handed_off_frames.fetch_add(1, Ordering::Relaxed);
        self.deliver_to_shard(to, frame, true);
    }

    /// The shard that must receive `frame`, sent by shard `from`, when it is addressed to
    /// one of the device's own GIDs (`None`: it goes to the driver). A frame to ourselves
    /// never leaves the device: the link would not bring it back (a NIC does the same
    /// internally; rxe loops such packets back in `rxe_loopback`).
    pub fn loopback_shard(&self, from: usize, frame: &[u8]) -> Option<usize> {
        let ip = crate::wire::frame::frame_dest_ip(frame)?;
        if !self.local_ips.contains(&ip) {
            return None;
        }
        if let Some(prefix) = self.qpn_prefix {
            let qpn = crate::wire::frame::frame_dest_qpn(frame)?;
            if crate::driver::relay::slot_of_qpn(qpn) != prefix {
                return None;
            }
        }
        let shards = self.shards.len();
        Some(match crate::wire::frame::frame_dest_qpn(frame) {
            Some(qpn) if shards > 1 => crate::engine::shard_of_qpn(qpn, shards as u32) as usize,
            _ => from,
        })
    }

    /// Hands a frame that shard `from` sent to ourselves to shard `to`, as the link would
    /// deliver it. To the sender's own shard it costs no wake-up: whoever holds that shard's
    /// token runs one more round when `pending` is set, and that round receives it.
    pub fn loop_back(&self, from: usize, to: usize, frame: &[u8]) {
        self.record(false, frame);
        self.stats
            .looped_back_frames
            .fetch_add(1, Ordering::Relaxed);
        self.deliver_to_shard(to, frame, to != from);
    }

    /// Puts `frame` in shard `to`'s inbox and makes sure it looks soon: its poller's next
    /// round, or (`wake`) its background thread, woken if asleep.
    fn deliver_to_shard(&self, to: usize, frame: &[u8], wake: bool) {
        let s = &self.shards[to];
        lock(&s.inbox).push(frame);
        s.inbox_waiting.store(true, Ordering::SeqCst);
        s.pending.store(true, Ordering::SeqCst);
        let wake_at = s.thread_wake_at.load(Ordering::SeqCst);
        if wake && wake_at != progress::THREAD_AWAKE && wake_at != progress::THREAD_YIELDING {
            self.wake(to);
        }
    }

    /// Routes engine events: CQ notifications to the CQ's completion channel, the rest to
    /// the device's asynchronous event queue.
    pub fn dispatch(&self, events: impl IntoIterator<Item = Event>) {
        for ev in events {
            match ev {
                Event::CqNotify(cq) => {
                    let channel = lock(&self.channels).get(&cq.0).cloned();
                    if let Some(channel) = channel {
                        channel.notify(cq);
                    }
                }
                other => self.async_events.push(other),
            }
        }
    }

    pub fn record(&self, outgoing: bool, bytes: &[u8]) {
        if self.trace_limit == 0 {
            return;
        }
        let mut trace = lock(&self.trace);
        if trace.len() >= self.trace_limit {
            trace.pop_front();
        }
        trace.push_back(TracedFrame {
            at: self.start.elapsed(),
            outgoing,
            bytes: bytes.to_vec(),
        });
    }
}

/// Empties a non-blocking wake-up socket (each byte in it is one "something happened").
pub(crate) fn drain(sock: &UnixDatagram) {
    let mut buf = [0u8; 64];
    // MSG_DONTWAIT, not the fd's flag: an event fd handed to a C program stays blocking
    // until the program itself sets O_NONBLOCK (and then expects EAGAIN from the verbs).
    while let Ok((n, _)) = rustix::net::recv(sock, &mut buf, rustix::net::RecvFlags::DONTWAIT) {
        if n == 0 {
            break;
        }
    }
}

/// The shared half of a completion channel: the progress thread (or any verbs call) pushes
/// the id of a CQ that fired and writes a byte to make the fd readable.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub(crate) rx: UnixDatagram,
    pub(crate) tx: UnixDatagram,
    pub(crate) fired: Mutex<VecDeque<CqId>>,
}

impl ChannelShared {
    pub fn notify(&self, cq: CqId) {
        lock(&self.fired).push_back(cq);
        let _ = self.tx.send(&[1]);
    }

    /// Makes the fd readable without an event: a waiter looks again (the device stopped).
    pub fn wake(&self) {
        let _ = self.tx.send(&[1]);
    }
}

/// What a caught panic said.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
