//! How often this machine takes the core away from a thread that never gives it up: a
//! thread spins reading the clock, and every gap between two readings longer than
//! [`HICCUP_NS`] is a moment it did not run (an interrupt, the hypervisor running something
//! else on the physical CPU, the scheduler). No ping-pong is faster than the machine under
//! it: once a round trip is longer than 1 % of the time between two hiccups, more than 1 %
//! of the round trips contain one, and the 99th percentile is a hiccup's length, not the
//! stack's (docs/performance.md, "The machine's hiccups and the p99 target").

use serde::Serialize;

/// A gap between two clock readings longer than this is a hiccup: far above a clock read
/// (tens of ns), below what a ping-pong notices.
pub const HICCUP_NS: u64 = 5_000;

/// What one spin found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hiccups {
    /// How long the thread spun.
    pub seconds: f64,
    /// Gaps longer than [`HICCUP_NS`] per second.
    pub per_second: f64,
    /// The median gap's length, microseconds (`None` without a hiccup).
    pub median_us: Option<f64>,
    /// The 90th percentile gap's length, microseconds.
    pub p90_us: Option<f64>,
    /// The median time from one hiccup to the next, microseconds (`None` with fewer than
    /// two).
    pub median_interval_us: Option<f64>,
}

impl Hiccups {
    /// The longest round trip whose 99th percentile is still clear of the hiccups: 1 % of
    /// the mean time between two of them (`None` when there were none to speak of).
    pub fn clear_round_trip_us(&self) -> Option<f64> {
        (self.per_second > 0.0).then(|| 0.01 * 1e6 / self.per_second)
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        match (self.median_us, self.p90_us, self.clear_round_trip_us()) {
            (Some(median), Some(p90), Some(clear)) => format!(
                "a thread spinning for {:.1} s lost its core for more than {} us {:.0} times a second \
                 (median {median:.1} us, 90 % under {p90:.1} us{}): a ping-pong whose round trip is longer than \
                 {clear:.1} us has more than 1 % of its round trips hit, and its p99 is this machine's, not its own",
                self.seconds,
                HICCUP_NS / 1000,
                self.per_second,
                self.median_interval_us
                    .map_or(String::new(), |i| format!(", one every {:.2} ms", i / 1000.0)),
            ),
            _ => format!(
                "a thread spinning for {:.1} s never lost its core for more than {} us",
                self.seconds,
                HICCUP_NS / 1000
            ),
        }
    }
}

/// Spins for `duration_ns` on `clock` (nanoseconds, never going back) and counts the gaps
/// longer than `hiccup_ns` between two readings.
pub fn spin(mut clock: impl FnMut() -> u64, duration_ns: u64, hiccup_ns: u64) -> Hiccups {
    let start = clock();
    let mut prev = start;
    let mut gaps = Vec::new();
    let mut intervals = Vec::new();
    let mut last_hiccup = None;
    loop {
        let now = clock();
        let gap = now.saturating_sub(prev);
        if gap > hiccup_ns {
            gaps.push(gap);
            if let Some(last) = last_hiccup {
                intervals.push(now - last);
            }
            last_hiccup = Some(now);
        }
        prev = now;
        if now - start >= duration_ns {
            break;
        }
    }
    let seconds = (prev - start) as f64 / 1e9;
    let quantile_us = |v: &mut Vec<u64>, q: f64| {
        v.sort_unstable();
        (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3)
    };
    Hiccups {
        seconds,
        per_second: gaps.len() as f64 / seconds.max(1e-9),
        median_us: quantile_us(&mut gaps, 0.5),
        p90_us: quantile_us(&mut gaps, 0.9),
        median_interval_us: quantile_us(&mut intervals, 0.5),
    }
}

/// [`spin`] on the monotonic clock for `duration`, on the calling thread.
pub fn measure(duration: std::time::Duration) -> Hiccups {
    let origin = std::time::Instant::now();
    spin(
        || origin.elapsed().as_nanos() as u64,
        duration.as_nanos() as u64,
        HICCUP_NS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock read every 40 ns that, every millisecond, stops for 8 us (every fourth time
    /// for 20 us).
    fn clock_with_hiccups() -> impl FnMut() -> u64 {
        let (mut t, mut next_hiccup, mut n) = (0u64, 1_000_000u64, 0u32);
        move || {
            t += 40;
            if t >= next_hiccup {
                n += 1;
                t += if n % 4 == 0 { 20_000 } else { 8_000 };
                next_hiccup += 1_000_000;
            }
            t
        }
    }

    #[test]
    fn a_clock_that_stops_every_millisecond_is_read_as_such() {
        let h = spin(clock_with_hiccups(), 200_000_000, HICCUP_NS);
        assert!((h.seconds - 0.2).abs() < 0.001, "{h:?}");
        assert!((h.per_second - 1000.0).abs() < 10.0, "{h:?}");
        let median = h.median_us.unwrap();
        assert!((median - 8.04).abs() < 0.1, "{h:?}");
        let p90 = h.p90_us.unwrap();
        assert!((p90 - 20.04).abs() < 0.1, "{h:?}");
        let interval = h.median_interval_us.unwrap();
        assert!((interval - 1000.0).abs() < 25.0, "{h:?}");
        // 1 % of a millisecond.
        let clear = h.clear_round_trip_us().unwrap();
        assert!((clear - 10.0).abs() < 0.2, "{h:?}");
        let line = h.describe();
        assert!(
            line.contains("more than 5 us") && line.contains("times a second"),
            "{line}"
        );
        assert!(
            line.contains(&format!("longer than {clear:.1} us")),
            "{line}"
        );
    }

    #[test]
    fn a_clock_that_never_stops_has_no_hiccups() {
        let mut t = 0u64;
        let h = spin(
            || {
                t += 40;
                t
            },
            10_000_000,
            HICCUP_NS,
        );
        assert_eq!(h.per_second, 0.0);
        assert_eq!((h.median_us, h.median_interval_us), (None, None));
        assert_eq!(h.clear_round_trip_us(), None);
        assert!(h.describe().contains("never lost it"), "{}", h.describe());
        // Gaps at the threshold are not hiccups.
        let mut t = 0u64;
        let h = spin(
            || {
                t += HICCUP_NS;
                t
            },
            1_000_000,
            HICCUP_NS,
        );
        assert_eq!(h.per_second, 0.0);
    }
}
