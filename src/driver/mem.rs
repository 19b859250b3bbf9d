//! The in-memory driver: two (or more) endpoints of the same process joined by a simulated
//! Ethernet link made of queues, with optional seeded loss and a switch that cuts the link
//! (a peer that disappears). It lets every verbs-level behaviour be tested without
//! privileges, namespaces or a kernel in the data path.
//!
//! ```text
//!  MemDriver A ──send/flush──▶ queue A→B ──recv──▶ MemDriver B
//!              ◀──recv─────── queue B→A ◀──send/flush──
//!        each queue push also writes one byte to a notification socket, so
//!        `wait_fd()` works with poll/epoll like an AF_XDP socket's fd.
//! ```
//!
//! Frames are whole Ethernet frames, never altered; the receiver sees exactly what was sent
//! (so the ICRC is verifiable). A lost frame is counted in [`MemLinkStats`].
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Driver, DriverError, DriverInfo, DriverMode, RxMeta};

/// Frames a direction may hold before the sender sees [`DriverError::TxBusy`].
pub const MEM_QUEUE_FRAMES: usize = 8192;

/// How the simulated link behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct MemLinkConfig {
    /// Link (IP) MTU of both ends, 576..=9000.
    pub mtu: u32,
    /// Probability in 0.0..1.0 that a frame is lost, each direction.
    pub loss: f64,
    /// Seed of the loss decisions (same seed, same frames sent: same frames lost).
    pub seed: u64,
}

impl Default for MemLinkConfig {
    fn default() -> Self {
        MemLinkConfig {
            mtu: 1500,
            loss: 0.0,
            seed: 1,
        }
    }
}

/// Counters of one simulated link, shared by both ends.
#[derive(Debug, Default)]
pub struct MemLinkStats {
    /// Frames handed to the link by either end.
    pub sent: AtomicU64,
    /// Frames delivered into the other end's queue.
    pub delivered: AtomicU64,
    /// Frames dropped by the seeded loss.
    pub lost: AtomicU64,
    /// Frames dropped because the link was cut.
    pub cut: AtomicU64,
}

/// A handle on the link shared by the two ends: read its counters, cut or restore it.
#[derive(Clone, Debug)]
pub struct MemLink {
    state: Arc<MemLinkState>,
}

impl MemLink {
    /// The link's counters.
    pub fn stats(&self) -> &MemLinkStats {
        &self.state.stats
    }

    /// Cut (`true`) or restore (`false`) the link: while cut, every frame is dropped, as if
    /// the peer had disappeared.
    pub fn set_cut(&self, cut: bool) {
        self.state.cut.store(cut, Ordering::SeqCst);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.state.cut.load(Ordering::SeqCst)
    }
}

/// What both ends of a link share: the frames in flight each way, the loss decisions, the
/// cut switch and the counters.
#[derive(Debug)]
struct MemLinkState {
    /// `queues[i]` holds frames for end `i`.
    queues: [Mutex<VecDeque<Vec<u8>>>; 2],
    /// `notified[i]`: notification bytes written to end `i` (or being written) and not yet
    /// read ([`notify`]): a receive reads that many, so a busy poller makes no system call
    /// for an empty link.
    notified: [AtomicU32; 2],
    loss: f64,
    rng: Mutex<ChaCha8Rng>,
    cut: AtomicBool,
    stats: MemLinkStats,
}

/// One end of an in-memory link.
#[derive(Debug)]
pub struct MemDriver {
    state: Arc<MemLinkState>,
    /// 0 or 1: which queue is ours to read.
    end: usize,
    mac: [u8; 6],
    mtu: u32,
    /// Readable when our queue may hold frames.
    notify_rx: UnixDatagram,
    /// Writing to it wakes the other end.
    notify_peer: UnixDatagram,
    /// Writing to it makes our own `notify_rx` readable.
    notify_self: UnixDatagram,
    pending: Vec<Vec<u8>>,
    /// The last receive found no frame (the next that finds none reads the notifications).
    found_nothing_last: bool,
}

impl MemDriver {
    /// Two joined ends with the given MACs; also returns the handle on the link.
    pub fn pair(
        mac_a: [u8; 6],
        mac_b: [u8; 6],
        config: &MemLinkConfig,
    ) -> Result<(MemDriver, MemDriver, MemLink), DriverError> {
        if !(576..=9000).contains(&config.mtu) {
            return Err(DriverError::Config {
                reason: format!("mem link MTU {} outside 576..=9000", config.mtu),
            });
        }
        if !(0.0..1.0).contains(&config.loss) {
            return Err(DriverError::Config {
                reason: format!("mem link loss {} outside 0.0..1.0", config.loss),
            });
        }
        let state = Arc::new(MemLinkState {
            queues: [Mutex::default(), Mutex::default()],
            notified: [AtomicU32::new(0), AtomicU32::new(0)],
            loss: config.loss,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed)),
            cut: AtomicBool::new(false),
            stats: MemLinkStats::default(),
        });
        // Two socket pairs: (a_rx, to_a) and (b_rx, to_b).
        let (a_rx, to_a) = notify_pair()?;
        let (b_rx, to_b) = notify_pair()?;
        let to_b_self = to_b
            .try_clone()
            .map_err(|e| DriverError::io("cloning a socket", e))?;
        let a = MemDriver {
            state: state.clone(),
            end: 0,
            mac: mac_a,
            mtu: config.mtu,
            notify_rx: a_rx,
            notify_self: to_a
                .try_clone()
                .map_err(|e| DriverError::io("cloning a socket", e))?,
            notify_peer: to_b,
            pending: Vec::new(),
            found_nothing_last: false,
        };
        let b = MemDriver {
            state: state.clone(),
            end: 1,
            mac: mac_b,
            mtu: config.mtu,
            notify_rx: b_rx,
            notify_self: to_b_self,
            notify_peer: to_a,
            pending: Vec::new(),
            found_nothing_last: false,
        };
        Ok((a, b, MemLink { state }))
    }

    /// Hands up to `max` queued frames to `on_frame`; how many.
    fn take_frames(&self, max: usize, on_frame: &mut dyn FnMut(&[u8], RxMeta)) -> usize {
        let mut n = 0;
        while n < max {
            let frame = {
                let mut queue = self.state.queues[self.end]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                queue.pop_front()
            };
            let Some(frame) = frame else { break };
            on_frame(
                &frame,
                RxMeta {
                    icrc_verifiable: true,
                },
            );
            n += 1;
        }
        n
    }

    /// Reads the notification bytes counted for this end: one read per byte, none counted
    /// (an idle link) no system call.
    fn read_notifications(&self) -> Result<(), DriverError> {
        let mut byte = [0u8; 16];
        let notified = &self.state.notified[self.end];
        let mut unread = notified.swap(0, Ordering::Acquire);
        while unread > 0 {
            match self.notify_rx.recv(&mut byte) {
                Ok(_) => unread -= 1,
                // Counted, not yet written: the writer is between its count and its byte.
                // The count goes back for the next receive to read.
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    notified.fetch_add(unread, Ordering::Release);
                    break;
                }
                Err(e) => return Err(DriverError::io("mem link notification", e)),
            }
        }
        Ok(())
    }

    fn max_frame(&self) -> usize {
        // Ethernet header and two VLAN tags on top of the IP MTU.
        self.mtu as usize + 14 + 8
    }
}

/// Writes one notification byte to `socket` for the end whose count is `notified`. The count
/// goes up before the byte is written and back down when no byte was, so every byte in the
/// socket is counted (a receive that finds the count at zero leaves no byte behind to keep
/// its fd readable); a full socket already reads as readable and takes no byte.
fn notify(socket: &UnixDatagram, notified: &AtomicU32) -> Result<(), DriverError> {
    notified.fetch_add(1, Ordering::Release);
    match socket.send(&[1]) {
        Ok(_) => Ok(()),
        Err(e) => {
            notified.fetch_sub(1, Ordering::Release);
            match e.kind() {
                ErrorKind::WouldBlock => Ok(()),
                // The other end was dropped: its frames are lost, like frames sent to a host
                // that went away (the transport's retry then gives up), not a local failure.
                ErrorKind::ConnectionRefused | ErrorKind::NotConnected | ErrorKind::BrokenPipe => {
                    Ok(())
                }
                _ => Err(DriverError::io("mem link notify", e)),
            }
        }
    }
}

fn notify_pair() -> Result<(UnixDatagram, UnixDatagram), DriverError> {
    let (rx, tx) =
        UnixDatagram::pair().map_err(|e| DriverError::io("creating a notification pair", e))?;
    for s in [&rx, &tx] {
        s.set_nonblocking(true)
            .map_err(|e| DriverError::io("making the notification pair non-blocking", e))?;
    }
    Ok((rx, tx))
}

impl Driver for MemDriver {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        if frame.len() > self.max_frame() {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.max_frame(),
            });
        }
        if self.pending.len() >= MEM_QUEUE_FRAMES {
            return Err(DriverError::TxBusy);
        }
        self.pending.push(frame.to_vec());
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let stats = &self.state.stats;
        let mut delivered_any = false;
        {
            let mut queue = self.state.queues[1 - self.end]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut rng = self.state.rng.lock().unwrap_or_else(|p| p.into_inner());
            let mut taken = 0;
            for frame in self.pending.iter_mut() {
                if queue.len() >= MEM_QUEUE_FRAMES {
                    break; // the receiver is behind: keep the rest for the next flush
                }
                taken += 1;
                stats.sent.fetch_add(1, Ordering::Relaxed);
                if self.state.cut.load(Ordering::Relaxed) {
                    stats.cut.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if self.state.loss > 0.0 && rng.gen_bool(self.state.loss) {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                queue.push_back(std::mem::take(frame));
                stats.delivered.fetch_add(1, Ordering::Relaxed);
                delivered_any = true;
            }
            self.pending.drain(..taken);
        }
        if delivered_any {
            // Frames are queued before the byte is written, so a receiver that sees the byte
            // finds them. A full notification buffer already means "readable".
            notify(&self.notify_peer, &self.state.notified[1 - self.end])?;
        }
        Ok(())
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        // Frames first: a busy poller takes them with no system call. The notifications are
        // read by the second receive in a row that finds no frame (the first is most often
        // the round that sends the answer, while the sender's byte may still be on its
        // way), and the queue is looked at again after them: a frame is queued before its
        // byte is counted and written, so a byte read means its frame is found now, and a
        // frame queued later brings a byte of its own. No wake-up is lost, and until then
        // the fd stays readable, so a waiter comes back.
        let mut n = self.take_frames(max, on_frame);
        if n == 0 {
            if self.found_nothing_last {
                self.read_notifications()?;
                n = self.take_frames(max, on_frame);
            }
            self.found_nothing_last = n == 0;
        } else {
            self.found_nothing_last = false;
        }
        if n == max {
            // More may be waiting: make sure the fd stays readable.
            let more = !self.state.queues[self.end]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
            if more {
                // Keep our fd readable so a caller that waits before draining still wakes.
                let _ = notify(&self.notify_self, &self.state.notified[self.end]);
            }
        }
        Ok(n)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.notify_rx.as_fd())
    }

    fn info(&self) -> DriverInfo {
        DriverInfo {
            name: format!("mem{}", self.end),
            mode: DriverMode::Mem,
            ifindex: 0,
            mac: self.mac,
            mtu: self.mtu,
            max_frame: self.max_frame(),
            icrc_verifiable: true,
            xdp_attach: None,
            note: Some("in-memory link (tests and the sim demo): no kernel involved".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::wait_readable;
    use std::time::Duration;

    fn frames_of(driver: &mut MemDriver) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        driver
            .recv(usize::MAX, &mut |f, meta| {
                assert!(meta.icrc_verifiable);
                got.push(f.to_vec())
            })
            .unwrap();
        got
    }

    /// Two receives that find nothing: the second reads the notifications.
    fn idle_receives(driver: &mut MemDriver) {
        for _ in 0..2 {
            assert_eq!(driver.recv(usize::MAX, &mut |_, _| {}).unwrap(), 0);
        }
    }

    #[test]
    fn frames_cross_in_order_both_ways() {
        let (mut a, mut b, link) = MemDriver::pair(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            &MemLinkConfig::default(),
        )
        .unwrap();
        assert_eq!(
            wait_readable(&[b.wait_fd().unwrap()], Some(Duration::ZERO)).unwrap(),
            [false]
        );
        for i in 0..10u8 {
            a.send(&[i; 60]).unwrap();
        }
        assert!(frames_of(&mut b).is_empty(), "nothing moves before flush");
        a.flush().unwrap();
        assert_eq!(
            wait_readable(&[b.wait_fd().unwrap()], Some(Duration::from_secs(1))).unwrap(),
            [true]
        );
        let got = frames_of(&mut b);
        assert_eq!(got.len(), 10);
        assert!(got.iter().enumerate().all(|(i, f)| f == &vec![i as u8; 60]));
        // The second receive in a row that finds the queue empty reads the notifications.
        assert!(frames_of(&mut b).is_empty());
        assert_eq!(
            wait_readable(&[b.wait_fd().unwrap()], Some(Duration::ZERO)).unwrap(),
            [true],
            "one empty receive leaves the notification"
        );
        assert!(frames_of(&mut b).is_empty());
        assert_eq!(
            wait_readable(&[b.wait_fd().unwrap()], Some(Duration::ZERO)).unwrap(),
            [false],
            "notification drained"
        );
        b.send(&[9; 100]).unwrap();
        b.flush().unwrap();
        assert_eq!(frames_of(&mut a), vec![vec![9; 100]]);
        assert_eq!(link.stats().delivered.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn bounded_recv_keeps_fd_readable() {
        let (mut a, mut b, _) = MemDriver::pair([2; 6], [4; 6], &MemLinkConfig::default()).unwrap();
        for i in 0..5u8 {
            a.send(&[i; 64]).unwrap();
        }
        a.flush().unwrap();
        assert_eq!(b.recv(2, &mut |_, _| {}).unwrap(), 2);
        let readable =
            |b: &MemDriver| wait_readable(&[b.wait_fd().unwrap()], Some(Duration::ZERO)).unwrap();
        assert_eq!(readable(&b), [true]);
        assert_eq!(b.recv(10, &mut |_, _| {}).unwrap(), 3);
        idle_receives(&mut b);
        assert_eq!(readable(&b), [false]);
    }

    #[test]
    fn idle_receives_drain_every_flush_notification() {
        let (mut a, mut b, _) = MemDriver::pair([2; 6], [4; 6], &MemLinkConfig::default()).unwrap();
        let readable =
            |b: &MemDriver| wait_readable(&[b.wait_fd().unwrap()], Some(Duration::ZERO)).unwrap();
        // More flushes than the notification socket holds bytes: the ones it refused are
        // counted too, and the receive reads what is there and stops.
        for round in [5usize, 3000] {
            for i in 0..round {
                a.send(&[i as u8; 64]).unwrap();
                a.flush().unwrap();
            }
            assert_eq!(readable(&b), [true]);
            // Frames are taken with no system call; the fd stays readable until a second
            // receive in a row finds the queue empty and reads every notification at once.
            assert_eq!(b.recv(usize::MAX, &mut |_, _| {}).unwrap(), round);
            assert_eq!(readable(&b), [true], "after {round} flushes, frames taken");
            idle_receives(&mut b);
            assert_eq!(readable(&b), [false], "after {round} flushes, drained");
            // A frame that comes while the notifications are read is taken in that receive.
            a.send(&[7; 64]).unwrap();
            a.flush().unwrap();
            assert_eq!(b.recv(usize::MAX, &mut |_, _| {}).unwrap(), 1);
            idle_receives(&mut b);
        }
    }

    #[test]
    fn seeded_loss_is_deterministic_and_counted() {
        let run = |seed| {
            let config = MemLinkConfig {
                loss: 0.3,
                seed,
                ..Default::default()
            };
            let (mut a, mut b, link) = MemDriver::pair([2; 6], [4; 6], &config).unwrap();
            for i in 0..200u8 {
                a.send(&[i; 64]).unwrap();
            }
            a.flush().unwrap();
            let got: Vec<u8> = frames_of(&mut b).iter().map(|f| f[0]).collect();
            let lost = link.stats().lost.load(Ordering::Relaxed);
            assert_eq!(got.len() as u64 + lost, 200);
            assert!(
                (30..90).contains(&lost),
                "about 30% of 200 lost, got {lost}"
            );
            got
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn cut_link_drops_everything_until_restored() {
        let (mut a, mut b, link) =
            MemDriver::pair([2; 6], [4; 6], &MemLinkConfig::default()).unwrap();
        link.set_cut(true);
        a.send(&[1; 64]).unwrap();
        a.flush().unwrap();
        assert!(frames_of(&mut b).is_empty());
        assert_eq!(link.stats().cut.load(Ordering::Relaxed), 1);
        link.set_cut(false);
        a.send(&[2; 64]).unwrap();
        a.flush().unwrap();
        assert_eq!(frames_of(&mut b), vec![vec![2; 64]]);
    }

    #[test]
    fn oversized_frames_and_bad_config_are_errors() {
        let (mut a, _b, _) = MemDriver::pair([2; 6], [4; 6], &MemLinkConfig::default()).unwrap();
        assert!(matches!(
            a.send(&vec![0; 1523]),
            Err(DriverError::FrameTooLarge {
                len: 1523,
                max: 1522
            })
        ));
        let bad = MemLinkConfig {
            loss: 1.0,
            ..Default::default()
        };
        assert!(matches!(
            MemDriver::pair([2; 6], [4; 6], &bad),
            Err(DriverError::Config { .. })
        ));
    }
}
