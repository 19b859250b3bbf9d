//! The progress thread: the only place the engine meets the driver.
//!
//! Each round, with the engine locked:
//! 1. drain up to [`RX_BATCH`] received frames into `handle_frame(now, ..)` (or
//!    `handle_frame_unverified` when the driver cannot see the real IP header);
//! 2. run `handle_timeout(now)` when a transport timer is due;
//! 3. drain `poll_transmit` into the driver (frames the driver cannot take yet wait in a
//!    small backlog), and deliver the engine's events to completion channels.
//!
//! Then, unlocked: `flush` the driver. If nothing happened, wait: in wake-up mode in poll(2)
//! on the driver's fd and the device's wake-up socket (written by every send post; a posted receive gives it nothing to do) until the
//! engine's next timer; in busy-poll mode not at all. So the responder answers READs, WRITEs
//! and atomics even when the application never calls `poll`.
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::driver::{wait_readable, Driver, DriverError};
use crate::engine::{Instant, MAX_FRAME_LEN};

use super::device::{drain, lock, DeviceState, ProgressMode};

/// Frames taken from the driver per round.
pub const RX_BATCH: usize = 64;
/// Frames sent per round before receiving again (keeps ACKs flowing under load).
pub const TX_BATCH: usize = 128;
/// Longest sleep when the driver has no fd to wait on, or the backlog is waiting for room.
const SHORT_WAIT: Duration = Duration::from_micros(200);
/// How often the XDP counters are refreshed while busy (when idle, `Device::xdp_stats` asks
/// for a fresh reading and wakes the thread).
const STATS_PERIOD: Duration = Duration::from_millis(100);

pub(crate) fn run(shared: Arc<DeviceState>, mut driver: Box<dyn Driver>, waker: UnixDatagram) {
    let mut buf = vec![0u8; MAX_FRAME_LEN.max(driver.info().max_frame)];
    let mut backlog: VecDeque<Vec<u8>> = VecDeque::new();
    let mut last_stats = Instant::ZERO;
    let verify = driver.info().icrc_verifiable;
    while !shared.stop.load(Ordering::SeqCst) {
        let now = shared.now();
        let mut work = 0usize;
        let mut events = Vec::new();
        let next_timer;
        {
            let mut engine = lock(&shared.engine);
            let received = driver.recv(RX_BATCH, &mut |frame, meta| {
                shared.record(false, frame);
                if verify && meta.icrc_verifiable {
                    engine.handle_frame(now, frame);
                } else {
                    engine.handle_frame_unverified(now, frame);
                }
            });
            match received {
                Ok(n) => {
                    work += n;
                    shared
                        .stats
                        .rx_frames
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    fail(&shared, format!("receive failed: {e}"));
                    return;
                }
            }
            if engine.poll_timeout().is_some_and(|t| t <= now) {
                engine.handle_timeout(now);
                work += 1;
            }
            // Older frames first, then new ones while the driver has room.
            while let Some(frame) = backlog.front() {
                match driver.send(frame) {
                    Ok(()) => {
                        backlog.pop_front();
                        work += 1;
                    }
                    Err(DriverError::TxBusy) => break,
                    Err(_) => {
                        backlog.pop_front();
                        shared.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            let mut sent = 0;
            while backlog.is_empty() && sent < TX_BATCH {
                let Some(len) = engine.poll_transmit(now, &mut buf) else {
                    break;
                };
                sent += 1;
                shared.record(true, &buf[..len]);
                match driver.send(&buf[..len]) {
                    Ok(()) => {
                        shared.stats.tx_frames.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(DriverError::TxBusy) => backlog.push_back(buf[..len].to_vec()),
                    // A frame the driver refuses is lost like a frame lost on the wire
                    // (RC retries it), but the engine learns of it: a UD send completes
                    // with an error instead of success.
                    Err(e) => {
                        shared.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                        engine.report_send_failure(&e.to_string());
                    }
                }
            }
            work += sent;
            while let Some(ev) = engine.poll_event() {
                events.push(ev);
            }
            next_timer = engine.poll_timeout();
        }
        shared.dispatch(events);
        if let Err(e) = driver.flush() {
            if !matches!(e, DriverError::TxBusy) {
                fail(&shared, format!("transmit failed: {e}"));
                return;
            }
        }
        let wanted = shared.xdp_stats_wanted.swap(false, Ordering::SeqCst);
        if wanted || now - last_stats >= STATS_PERIOD {
            last_stats = now;
            if let Some(stats) = driver.xdp_stats() {
                *lock(&shared.xdp_stats) = Some(stats);
            }
            shared.xdp_stats_generation.fetch_add(1, Ordering::SeqCst);
        }
        if work > 0 {
            continue;
        }
        match shared.progress_mode {
            ProgressMode::BusyPoll => std::hint::spin_loop(),
            ProgressMode::Wakeup => {
                let mut timeout = next_timer.map(|t: Instant| t - shared.now());
                let mut fds = vec![waker.as_fd()];
                match driver.wait_fd() {
                    Some(fd) => fds.push(fd),
                    None => timeout = Some(timeout.map_or(SHORT_WAIT, |t| t.min(SHORT_WAIT))),
                }
                if !backlog.is_empty() {
                    timeout = Some(timeout.map_or(SHORT_WAIT, |t| t.min(SHORT_WAIT)));
                }
                shared.stats.sleeps.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = wait_readable(&fds, timeout) {
                    fail(&shared, format!("poll failed: {e}"));
                    return;
                }
                drain(&waker);
            }
        }
    }
}

/// Records why the progress thread stops (a driver error or a panic), then wakes every
/// completion channel so callers blocked in `get_cq_event` learn it; every later verbs call
/// (posts, polls, waits) returns `DeviceStopped` with this reason.
pub(crate) fn fail(shared: &DeviceState, reason: String) {
    tracing::error!(device = %shared.name, %reason, "progress thread stopped");
    *lock(&shared.stopped) = Some(reason);
    let channels: Vec<_> = lock(&shared.all_channels)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    for channel in channels {
        channel.wake();
    }
}
