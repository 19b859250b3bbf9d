//! Completion queues and completion channels.
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::driver::wait_readable;
use crate::engine::{CqId, Wc};

use super::attr::limits;
use super::device::{Core, Device, ObjectKind, ObjectSlot};
use super::error::{Result, VerbsError};
use super::runtime::{drain, lock, ChannelShared, Polled};

/// A completion channel (`ibv_comp_channel`): CQs armed with [`Cq::req_notify`] report
/// here when a completion arrives. Block on it with [`CompletionChannel::get_cq_event`], or
/// register [`AsRawFd::as_raw_fd`] with epoll/mio/tokio (`AsyncFd`): the fd is readable
/// while an event is pending.
#[derive(Clone, Debug)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelShared>,
    device: Device,
}

impl CompletionChannel {
    pub(crate) fn create(device: &Device) -> Result<CompletionChannel> {
        let (rx, tx) = UnixDatagram::pair().map_err(|source| VerbsError::Io {
            context: "creating a completion channel",
            source,
        })?;
        // Only the write end: the read end is the fd programs see, blocking until they say
        // otherwise (rdma-core's channel fds are).
        tx.set_nonblocking(true).map_err(|source| VerbsError::Io {
            context: "making a completion channel non-blocking",
            source,
        })?;
        let inner = Arc::new(ChannelShared {
            rx,
            tx,
            fired: Mutex::new(VecDeque::new()),
        });
        let mut all = lock(&device.shared().all_channels);
        all.retain(|c| c.strong_count() > 0);
        all.push(Arc::downgrade(&inner));
        drop(all);
        Ok(CompletionChannel {
            inner,
            device: device.clone(),
        })
    }

    /// Takes a pending event without blocking: the id of the CQ that fired.
    pub fn try_get_cq_event(&self) -> Option<CqId> {
        let fired = {
            let mut fired = lock(&self.inner.fired);
            let cq = fired.pop_front();
            if fired.is_empty() {
                drain(&self.inner.rx);
            }
            cq
        };
        fired
    }

    /// Waits for an event (`ibv_get_cq_event`): the id of the CQ that fired (compare with
    /// [`Cq::id`]). `None` waits forever. Re-arm the CQ with [`Cq::req_notify`] before
    /// polling it, so no completion slips between the poll and the next wait.
    ///
    /// If the device's progress thread stops (its driver failed, or it panicked), returns
    /// [`VerbsError::DeviceStopped`] with the cause at once, however long the timeout.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqId> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(cq) = self.try_get_cq_event() {
                return Ok(cq);
            }
            // `fail` records the cause before it wakes the channel, so a wake-up that
            // raced with this check still finds it on the next round.
            self.device.shared().check_alive()?;
            self.device.shared().stop_polling();
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(VerbsError::Timeout(timeout.unwrap_or_default()));
            }
            wait_readable(&[self.inner.rx.as_fd()], left).map_err(|source| VerbsError::Io {
                context: "waiting on a completion channel",
                source,
            })?;
        }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.rx.as_raw_fd()
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.rx.as_fd()
    }
}

pub(crate) struct CqInner {
    pub core: Arc<Core>,
    pub id: CqId,
    /// Changed by [`Cq::resize`].
    pub depth: AtomicU32,
    /// The shard it was placed on: its QPs are created there.
    pub home: usize,
    /// A bit for each shard that has a QP completing into this CQ (the home shard always):
    /// polling drives those shards.
    pub shards: AtomicU64,
    has_channel: bool,
    _slot: ObjectSlot,
}

impl CqInner {
    /// A QP on shard `shard` completes into this CQ.
    pub fn add_shard(&self, shard: usize) {
        self.shards.fetch_or(1 << shard, Ordering::Relaxed);
    }

    /// Runs `f` (a poll) in a progress round of each shard whose QPs complete here.
    fn poll_with<R>(&self, f: impl FnOnce(&mut crate::engine::Engine) -> R) -> Result<R> {
        let shared = &self.core.runtime;
        shared.hold_lease();
        let shards = self.shards.load(Ordering::Relaxed);
        let polled = Polled::Cq(self.id);
        if shards == 1 << self.home {
            shared.poll_engine(self.home, polled, f)
        } else {
            shared.poll_shards(shards, self.home, polled, f)
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let shared = &self.core.runtime;
        if self.has_channel {
            lock(&shared.channels).remove(&self.id.0);
        }
        let _ = shared.with_engine(self.home, false, |e| e.destroy_cq(self.id));
        // Whoever polled it is done with it: end the poller's lease now rather than when its
        // watchdog would.
        shared.stop_polling();
    }
}

/// A completion queue (`ibv_cq`). Clone to share between threads; polling is safe from any
/// thread. Queue pairs using it keep it alive.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.inner.id)
            .field("depth", &self.depth())
            .finish()
    }
}

impl Cq {
    pub(crate) fn create(
        device: &Device,
        depth: u32,
        channel: Option<&CompletionChannel>,
        shard: Option<u32>,
    ) -> Result<Cq> {
        let shards = device.shared().shards.len();
        if let Some(shard) = shard.filter(|&s| s as usize >= shards) {
            return Err(VerbsError::InvalidArgument(format!(
                "shard {shard}: {} has {shards} engine shard(s)",
                device.name()
            )));
        }
        if depth == 0 {
            return Err(VerbsError::Zero { what: "cqe" });
        }
        if depth > limits::MAX_CQE {
            return Err(VerbsError::LimitExceeded {
                what: "cqe",
                requested: depth as u64,
                max: limits::MAX_CQE as u64,
            });
        }
        let slot = ObjectSlot::take(&device.core, ObjectKind::Cq)?;
        let shared = device.shared();
        // Round robin unless placed: threads that each create their CQ (and its QPs) get
        // their own shard.
        let home = match shard {
            Some(shard) => shard as usize,
            None => shared.next_cq_shard.fetch_add(1, Ordering::Relaxed) % shards,
        };
        let id = shared.with_engine(home, false, |e| e.create_cq(depth))??;
        if let Some(channel) = channel {
            lock(&shared.channels).insert(id.0, channel.inner.clone());
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                core: device.core.clone(),
                id,
                depth: AtomicU32::new(depth),
                home,
                shards: AtomicU64::new(1 << home),
                has_channel: channel.is_some(),
                _slot: slot,
            }),
        })
    }

    /// The CQ's id (what a completion channel reports).
    pub fn id(&self) -> CqId {
        self.inner.id
    }

    /// Its depth.
    pub fn depth(&self) -> u32 {
        self.inner.depth.load(Ordering::Relaxed)
    }

    /// Resizes the CQ to `depth` entries (`ibv_resize_cq`); the completions it holds stay.
    /// Fewer entries than it holds now is an error (completions are never dropped), as is
    /// 0 or more than the device's `max_cqe`. Unlike a hardware CQ, the depth is exactly
    /// what was asked for.
    pub fn resize(&self, depth: u32) -> Result<()> {
        if depth == 0 {
            return Err(VerbsError::Zero { what: "cqe" });
        }
        if depth > limits::MAX_CQE {
            return Err(VerbsError::LimitExceeded {
                what: "cqe",
                requested: depth as u64,
                max: limits::MAX_CQE as u64,
            });
        }
        let inner = &self.inner;
        // Completions the posts before this call produce count (rdma-core's test_resize_cq
        // posts UD sends, then resizes below their number).
        inner.core.runtime.transmit_waiting_posts(inner.home)?;
        // Stored under the engine lock: concurrent resizes leave the depth of the last one.
        Ok(inner.core.runtime.with_engine(inner.home, false, |e| {
            e.resize_cq(inner.id, depth)
                .map(|()| inner.depth.store(depth, Ordering::Relaxed))
        })??)
    }

    /// The engine shard it was placed on (its QPs live there; see
    /// [`super::DeviceConfig::shards`]).
    pub fn shard(&self) -> u32 {
        self.inner.home as u32
    }

    /// Takes up to `wcs.len()` completions, oldest first (`ibv_poll_cq`); returns how many.
    ///
    /// When no other thread is making progress, this call does it first: it receives the
    /// frames waiting in the driver, answers them and transmits (see [`super::runtime::progress`]), so a
    /// busy-polling thread needs no hand-off from the background thread.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        Ok(self.inner.poll_with(|e| e.poll_cq(self.inner.id, wcs))??)
    }

    /// Takes one completion, if there is one.
    pub fn poll_one(&self) -> Result<Option<Wc>> {
        Ok(self.inner.poll_with(|e| e.poll_cq_one(self.inner.id))??)
    }

    /// Takes one completion already in the CQ without driving progress (so this thread is
    /// not taken for a poller: after [`Cq::req_notify`], the background thread keeps the
    /// driver). For the second look of "poll, arm, poll, sleep".
    pub(crate) fn take_one_quietly(&self) -> Result<Option<Wc>> {
        let id = self.inner.id;
        Ok(self
            .inner
            .core
            .runtime
            .with_engine(self.inner.home, false, |e| e.poll_cq_one(id))??)
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion (with `solicited_only`, the
    /// next solicited or failed one) raises one event on the CQ's completion channel.
    ///
    /// Arming says this thread is about to sleep on the channel: the background progress
    /// thread takes over receiving at once (see [`super::runtime::progress`]).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let shared = &self.inner.core.runtime;
        shared.stop_polling();
        let id = self.inner.id;
        Ok(shared.with_engine(self.inner.home, false, |e| {
            e.req_notify_cq(id, solicited_only)
        })??)
    }

    /// Polls until `count` completions have arrived or `timeout` passes; returns what
    /// arrived (fewer than `count` on timeout). Sleeps briefly between polls: a convenience
    /// for tools and tests, not the fast path.
    pub fn wait(&self, count: usize, timeout: Duration) -> Result<Vec<Wc>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        let mut spins = 0u32;
        while out.len() < count {
            match self.poll_one()? {
                Some(wc) => {
                    out.push(wc);
                    spins = 0;
                }
                None => {
                    if Instant::now() >= deadline {
                        break;
                    }
                    spins += 1;
                    if spins < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            }
        }
        Ok(out)
    }
}
