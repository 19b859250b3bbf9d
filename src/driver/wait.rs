//! Sleeping until file descriptors become readable: `poll(2)` through rustix.
//!
//! The progress thread of [`crate::verbs`] waits here on its driver's [`Driver::wait_fd`] and
//! its own wake-up socket at once; a completion channel waits here on its socket; tests and
//! benchmarks wait on a driver's fd with [`poll_readable`].
//!
//! [`Driver::wait_fd`]: super::Driver::wait_fd
use std::os::fd::BorrowedFd;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

/// What counts as "readable": data, or an error or hang-up that a read would report.
const READY: PollFlags = PollFlags::IN.union(PollFlags::ERR).union(PollFlags::HUP);

/// Waits until one of `fds` is readable or `timeout` passes (`None`: wait forever).
/// Returns, for each fd, whether it is readable. An interrupted wait (EINTR) returns all
/// `false`, like a timeout.
pub fn wait_readable(
    fds: &[BorrowedFd<'_>],
    timeout: Option<Duration>,
) -> std::io::Result<Vec<bool>> {
    let mut pollfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|&fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
        .collect();
    let timeout = timeout.map(whole_millis);
    match poll(&mut pollfds, timeout.as_ref()) {
        Ok(_) => Ok(pollfds
            .iter()
            .map(|p| p.revents().intersects(READY))
            .collect()),
        Err(Errno::INTR) => Ok(vec![false; fds.len()]),
        Err(e) => Err(e.into()),
    }
}

/// Waits until `fd` (a [`Driver::wait_fd`](super::Driver::wait_fd)) is readable or `timeout`
/// passes (`None`: forever). Returns whether it became readable; EINTR counts as "not
/// readable yet".
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> std::io::Result<bool> {
    Ok(wait_readable(&[fd], timeout)?[0])
}

/// `timeout` rounded up to whole milliseconds: the granularity of `poll(2)` that the
/// engine's timers have always been served with (a 100 us timer sleeps 1 ms, it does not
/// become a busy loop of 0 ms waits, nor wake sooner than it did).
fn whole_millis(timeout: Duration) -> Timespec {
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i64;
    Timespec {
        tv_sec: ms / 1000,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixDatagram;
    use std::time::Instant;

    #[test]
    fn reports_each_fd_and_times_out() {
        let (a_rx, a_tx) = UnixDatagram::pair().unwrap();
        let (b_rx, _b_tx) = UnixDatagram::pair().unwrap();
        let fds = [a_rx.as_fd(), b_rx.as_fd()];
        assert_eq!(
            wait_readable(&fds, Some(Duration::ZERO)).unwrap(),
            [false, false]
        );
        a_tx.send(&[1]).unwrap();
        assert_eq!(wait_readable(&fds, None).unwrap(), [true, false]);
        assert!(poll_readable(a_rx.as_fd(), Some(Duration::ZERO)).unwrap());
        let start = Instant::now();
        assert!(!poll_readable(b_rx.as_fd(), Some(Duration::from_millis(20))).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_hang_up_counts_as_readable() {
        let (rx, tx) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(tx);
        assert!(poll_readable(rx.as_fd(), Some(Duration::from_secs(1))).unwrap());
    }

    #[test]
    fn timeouts_round_up_to_whole_milliseconds() {
        let ts = |d| {
            let t = whole_millis(d);
            (t.tv_sec, t.tv_nsec)
        };
        assert_eq!(ts(Duration::ZERO), (0, 0));
        assert_eq!(ts(Duration::from_micros(100)), (0, 1_000_000));
        assert_eq!(ts(Duration::from_micros(1000)), (0, 1_000_000));
        assert_eq!(ts(Duration::from_micros(1001)), (0, 2_000_000));
        assert_eq!(ts(Duration::from_millis(2500)), (2, 500_000_000));
        assert_eq!(ts(Duration::MAX), (2_147_483, 647_000_000));
    }
}
