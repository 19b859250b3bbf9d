//! Time in the sans-IO engine: an [`Instant`] says *when*, a [`Duration`] *how long*.
//!
//! The engine reads no clock. Every entry point that depends on time takes `now: Instant`,
//! a point on the caller's clock: the verbs progress thread counts from when its device
//! opened, the simulator from zero of its virtual clock. Only the differences between
//! instants of one caller mean anything, so the epoch is the caller's to choose.
use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time: nanoseconds since an epoch the caller chooses.
///
/// `Instant + Duration` is an instant, `Instant - Instant` a duration (saturating at zero
/// when the right side is later); an instant cannot be added to another one or compared
/// with a duration. Arithmetic saturates instead of panicking (`u64` nanoseconds last 584
/// years, longer than any timer the engine arms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant { nanos: 0 };

    /// The instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant { nanos }
    }

    /// The instant `since_epoch` after the epoch (e.g. `Instant::from_elapsed(start.elapsed())`
    /// with a `std::time::Instant` start), saturating at the largest instant.
    pub fn from_elapsed(since_epoch: Duration) -> Instant {
        Instant {
            nanos: u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// How long after the epoch this instant is.
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// How long after `earlier` this instant is; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// `self + d`, or `None` past the largest instant.
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.nanos.checked_add(d).map(Instant::from_nanos)
    }

    /// `self - d`, or `None` before the epoch.
    pub fn checked_sub(self, d: Duration) -> Option<Instant> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.nanos.checked_sub(d).map(Instant::from_nanos)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.checked_add(d).unwrap_or(Instant::from_nanos(u64::MAX))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Saturates at the epoch.
    fn sub(self, d: Duration) -> Instant {
        self.checked_sub(d).unwrap_or(Instant::ZERO)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero.
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Instant {
    /// Microseconds with nanosecond digits since the epoch, e.g. `1234.567us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}us", self.nanos / 1000, self.nanos % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let t = Instant::from_nanos(1_000);
        assert_eq!((t + Duration::from_nanos(500)).as_nanos(), 1_500);
        assert_eq!(t - Instant::from_nanos(400), Duration::from_nanos(600));
        assert_eq!((t - Duration::from_nanos(1)).as_nanos(), 999);
        let mut u = t;
        u += Duration::from_micros(1);
        assert_eq!(u, Instant::from_nanos(2_000));
        assert_eq!(u.since_epoch(), Duration::from_micros(2));
        assert_eq!(
            Instant::from_elapsed(Duration::from_millis(3)).as_nanos(),
            3_000_000
        );
    }

    #[test]
    fn saturates_instead_of_panicking() {
        let t = Instant::from_nanos(10);
        // An earlier instant minus a later one is zero, not a panic.
        assert_eq!(t - Instant::from_nanos(20), Duration::ZERO);
        assert_eq!(
            t.saturating_duration_since(Instant::from_nanos(20)),
            Duration::ZERO
        );
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(t.checked_sub(Duration::from_nanos(11)), None);
        let end = Instant::from_nanos(u64::MAX);
        assert_eq!(end + Duration::from_secs(1), end);
        assert_eq!(end.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(Instant::ZERO.checked_add(Duration::MAX), None);
        assert_eq!(Instant::from_elapsed(Duration::MAX), end);
    }

    #[test]
    fn orders_and_prints() {
        assert!(Instant::ZERO < Instant::from_nanos(1));
        assert_eq!(Instant::default(), Instant::ZERO);
        assert_eq!(Instant::from_nanos(1_234_567).to_string(), "1234.567us");
        assert_eq!(Instant::ZERO.to_string(), "0.000us");
    }
}
