//! Latency and bandwidth statistics, computed the way perftest does so numbers compare.
//!
//! Latency (perftest `print_report_lat`): the samples are the gaps between consecutive
//! iteration timestamps (`iters - 1` of them). SEND and WRITE latency tests ping-pong, so
//! one gap is a round trip and is halved (`rtt_factor` 2); READ and atomics measure one
//! request/response per gap (factor 1). The samples are sorted and the 2 largest dropped
//! (`LAT_MEASURE_TAIL`); then min = first, max = the first dropped-off index
//! (`delta[measure_cnt]`, as perftest prints), typical = median, average and standard
//! deviation over the kept samples, and the 99th / 99.9th percentiles are
//! `delta[ceil(n * 0.99)]` / `delta[ceil(n * 0.999)]`.
//!
//! Bandwidth (perftest `print_report_bw`): average = bytes / (last completion - first
//! post); peak = the best rate over any window that starts at a post and ends at a
//! signalled completion; message rate in Mpps. MB/s uses 2^20 bytes, Gb/s uses 10^9 bits
//! (`--report_gbits`).
//!
//! perftest measures the peak only where it has a post time per message: not on the
//! send_bw server (a receive has no post time), not with `-D`, not above 20000 iterations
//! (perftest_parameters.c prints "WARNING: BW peak won't be measured in this run." and
//! reports 0). [`BwTimes`] keeps per-message times only when the peak is measured, so a
//! long run needs no memory per message.

/// Samples perftest drops from the top before computing latency statistics.
pub const LAT_MEASURE_TAIL: usize = 2;

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyStats {
    /// Samples used (after dropping the tail).
    pub samples: usize,
    /// Smallest sample.
    pub min: f64,
    /// perftest's `t_max`: the largest kept sample's successor (`delta[measure_cnt]`).
    pub max: f64,
    /// Median ("t_typical").
    pub median: f64,
    /// Mean of the kept samples.
    pub average: f64,
    /// Standard deviation of the kept samples.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
}

impl LatencyStats {
    /// Statistics from per-iteration gaps (already in µs and already divided by the
    /// round-trip factor). Needs at least `LAT_MEASURE_TAIL + 1` samples.
    pub fn from_samples(samples_usec: &[f64]) -> Option<Self> {
        if samples_usec.len() <= LAT_MEASURE_TAIL || samples_usec.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut delta = samples_usec.to_vec();
        delta.sort_by(|a, b| a.total_cmp(b));
        let n = delta.len() - LAT_MEASURE_TAIL;
        // get_median: an even count averages the middle two.
        let median = if (n - 1) % 2 == 1 {
            (delta[n / 2] + delta[n / 2 - 1]) / 2.0
        } else {
            delta[n / 2]
        };
        let average = delta[..n].iter().sum::<f64>() / n as f64;
        let variance = delta[..n]
            .iter()
            .map(|d| (d - average).powi(2))
            .sum::<f64>()
            / n as f64;
        let idx = |q: f64| ((n as f64 * q).ceil() as usize).min(delta.len() - 1);
        Some(LatencyStats {
            samples: n,
            min: delta[0],
            max: delta[n],
            median,
            average,
            stdev: variance.sqrt(),
            p99: delta[idx(0.99)],
            p99_9: delta[idx(0.999)],
        })
    }
}

/// The samples of a latency test: the gaps between consecutive iteration starts (µs),
/// divided by `rtt_factor`, in the order measured.
pub fn gaps(starts_usec: &[f64], rtt_factor: f64) -> Vec<f64> {
    starts_usec
        .windows(2)
        .map(|w| (w[1] - w[0]) / rtt_factor)
        .collect()
}

/// The samples the statistics keep, sorted: all but the [`LAT_MEASURE_TAIL`] largest.
pub fn kept_sorted(samples_usec: &[f64]) -> Vec<f64> {
    let mut sorted = samples_usec.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted.truncate(sorted.len().saturating_sub(LAT_MEASURE_TAIL));
    sorted
}

/// Units of a bandwidth report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BwUnit {
    /// 2^20 bytes per second (perftest's default "MB/sec").
    MegabytesPerSec,
    /// 10^9 bits per second (`--report_gbits`).
    GigabitsPerSec,
}

impl BwUnit {
    /// Bytes per second in one unit (perftest's `format_factor`).
    pub fn bytes_per_unit(self) -> f64 {
        match self {
            BwUnit::MegabytesPerSec => 1_048_576.0,
            BwUnit::GigabitsPerSec => 125_000_000.0,
        }
    }
}

/// Bandwidth results of one message size.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BwStats {
    /// Message size.
    pub size: u64,
    /// Messages measured.
    pub iters: u64,
    /// Peak bandwidth in `unit`.
    pub peak: f64,
    /// Average bandwidth in `unit`.
    pub average: f64,
    /// Messages per second / 10^6.
    pub msg_rate_mpps: f64,
    /// Unit of `peak` and `average`.
    pub unit: BwUnit,
}

impl BwStats {
    /// From per-message post and completion times (µs, same clock). `completed[j]` is
    /// meaningful where a completion was observed; perftest signals every `cq_mod`-th
    /// message, so peak windows end at those indices (and at the last message).
    pub fn compute(
        size: u64,
        posted_usec: &[f64],
        completed_usec: &[f64],
        cq_mod: usize,
        unit: BwUnit,
    ) -> Option<Self> {
        let n = posted_usec.len().min(completed_usec.len());
        if n == 0 {
            return None;
        }
        let total = completed_usec[n - 1] - posted_usec[0];
        if total <= 0.0 || !total.is_finite() {
            return None;
        }
        let cq_mod = cq_mod.max(1);
        let mut best_per_msg = total / n as f64;
        // Bound the O(n^2 / cq_mod) search for big runs: windows start every `stride`.
        let stride = (n / 2000).max(1);
        for i in (0..n).step_by(stride) {
            let first_end = ((i + 1).div_ceil(cq_mod)) * cq_mod - 1;
            let ends = (first_end..n).step_by(cq_mod).chain(std::iter::once(n - 1));
            for j in ends {
                if j < i {
                    continue;
                }
                let t = (completed_usec[j] - posted_usec[i]) / (j - i + 1) as f64;
                if t > 0.0 && t < best_per_msg {
                    best_per_msg = t;
                }
            }
        }
        let per_unit = unit.bytes_per_unit();
        Some(BwStats {
            size,
            iters: n as u64,
            peak: size as f64 / (best_per_msg / 1e6) / per_unit,
            average: (size as f64 * n as f64) / (total / 1e6) / per_unit,
            msg_rate_mpps: n as f64 / total,
            unit,
        })
    }
}

/// perftest measures the BW peak only up to this many iterations per QP
/// (perftest_parameters.c: `iters > 20000` sets `noPeak`).
pub const MAX_PEAK_ITERS: u64 = 20_000;

/// The warning perftest prints when it will not measure the peak.
pub const NO_PEAK_WARNING: &str = " WARNING: BW peak won't be measured in this run.";

impl BwStats {
    /// Nothing measured: every figure 0 (a thread that completed nothing).
    pub fn nothing(size: u64, unit: BwUnit) -> Self {
        BwStats {
            size,
            iters: 0,
            peak: 0.0,
            average: 0.0,
            msg_rate_mpps: 0.0,
            unit,
        }
    }

    /// Average and message rate only (peak 0, as perftest reports it with `noPeak`), from
    /// `messages` of `size` bytes taking `elapsed_usec` in all.
    pub fn without_peak(size: u64, messages: u64, elapsed_usec: f64, unit: BwUnit) -> Option<Self> {
        if messages == 0 || !elapsed_usec.is_finite() || elapsed_usec <= 0.0 {
            return None;
        }
        Some(BwStats {
            size,
            iters: messages,
            peak: 0.0,
            average: (size as f64 * messages as f64) / (elapsed_usec / 1e6) / unit.bytes_per_unit(),
            msg_rate_mpps: messages as f64 / elapsed_usec,
            unit,
        })
    }
}

/// Post and completion times of a bandwidth run (µs since its start). With the peak, one
/// pair per message; without it only the first post, the last completion and a count.
#[derive(Debug, Clone)]
pub struct BwTimes {
    measure_peak: bool,
    posted: Vec<f64>,
    completed: Vec<f64>,
    /// Per QP, the index in `posted` of its k-th message.
    index_of: Vec<Vec<usize>>,
    first_post: Option<f64>,
    last_completion: f64,
    completed_messages: u64,
}

impl BwTimes {
    /// Times for `qps` QPs; `measure_peak` keeps a pair per message.
    pub fn new(qps: usize, measure_peak: bool) -> Self {
        BwTimes {
            measure_peak,
            posted: Vec::new(),
            completed: Vec::new(),
            index_of: vec![Vec::new(); qps],
            first_post: None,
            last_completion: 0.0,
            completed_messages: 0,
        }
    }

    /// Message number `posted_n` of `qp` was posted at `now`.
    pub fn posted(&mut self, qp: usize, now: f64) {
        self.first_post.get_or_insert(now);
        if self.measure_peak {
            self.posted.push(now);
            self.completed.push(f64::NAN);
            self.index_of[qp].push(self.posted.len() - 1);
        }
    }

    /// Messages `from..=to` of `qp` completed at `now` (one signalled completion retires
    /// every earlier unsignalled message of its QP).
    pub fn completed(&mut self, qp: usize, from: u64, to: u64, now: f64) {
        if to < from {
            return;
        }
        self.completed_messages += to - from + 1;
        self.last_completion = now;
        if self.measure_peak {
            for k in from..=to {
                if let Some(&idx) = self.index_of[qp].get(k as usize) {
                    self.completed[idx] = now;
                }
            }
        }
    }

    /// One run's times from its threads' (all on one clock): every message of each, ordered
    /// by post time as one thread with all the QPs would have them, from the first post of
    /// any to the last completion of any. The peak is kept only if every part kept it.
    pub fn merged(parts: &[BwTimes]) -> BwTimes {
        let measure_peak = !parts.is_empty() && parts.iter().all(|p| p.measure_peak);
        let mut pairs: Vec<(f64, f64)> = if measure_peak {
            parts
                .iter()
                .flat_map(|p| p.posted.iter().copied().zip(p.completed.iter().copied()))
                .collect()
        } else {
            Vec::new()
        };
        // Stable: one part's pairs keep their order.
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (posted, completed) = pairs.into_iter().unzip();
        BwTimes {
            measure_peak,
            posted,
            completed,
            index_of: Vec::new(),
            first_post: parts
                .iter()
                .filter_map(|p| p.first_post)
                .min_by(f64::total_cmp),
            last_completion: parts.iter().map(|p| p.last_completion).fold(0.0, f64::max),
            completed_messages: parts.iter().map(|p| p.completed_messages).sum(),
        }
    }

    /// The statistics of the messages known to have completed.
    pub fn stats(&self, size: u64, cq_mod: usize, unit: BwUnit) -> Option<BwStats> {
        if !self.measure_peak {
            let elapsed = self.last_completion - self.first_post?;
            return BwStats::without_peak(size, self.completed_messages, elapsed, unit);
        }
        let (posted, completed): (Vec<f64>, Vec<f64>) = self
            .posted
            .iter()
            .zip(&self.completed)
            .filter(|(_, c)| !c.is_nan())
            .map(|(p, c)| (*p, *c))
            .unzip();
        let mut stats = BwStats::compute(size, &posted, &completed, cq_mod, unit)?;
        // The average spans the first post to the last completion of any QP (perftest's
        // `tcompleted` is indexed by completion count, so its last entry is the last
        // completion). `compute` takes the completion of the message posted last, which
        // for several QPs, or threads merged, can be earlier and overstate the rate.
        let elapsed = self.last_completion - self.first_post?;
        if elapsed > 0.0 && elapsed.is_finite() {
            stats.average =
                (size as f64 * stats.iters as f64) / (elapsed / 1e6) / unit.bytes_per_unit();
            stats.msg_rate_mpps = stats.iters as f64 / elapsed;
        }
        Some(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_the_halved_gaps_and_the_kept_ones_drop_the_tail() {
        let g = gaps(&[0.0, 4.0, 10.0, 30.0, 32.0], 2.0);
        assert_eq!(g, vec![2.0, 3.0, 10.0, 1.0]);
        // Sorted, the two largest dropped (perftest's LAT_MEASURE_TAIL).
        assert_eq!(kept_sorted(&g), vec![1.0, 2.0]);
        assert!(kept_sorted(&[1.0]).is_empty());
    }

    #[test]
    fn latency_follows_perftest_rules() {
        // 12 samples: 1..=10 plus two outliers that the tail drop removes.
        let mut samples: Vec<f64> = (1..=10).map(f64::from).collect();
        samples.extend([1000.0, 2000.0]);
        let s = LatencyStats::from_samples(&samples).unwrap();
        assert_eq!(s.samples, 10);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0, "perftest prints delta[measure_cnt]");
        assert_eq!(s.median, 5.5);
        assert_eq!(s.average, 5.5);
        assert!((s.stdev - 2.8722813232690143).abs() < 1e-12);
        assert_eq!(s.p99, 1000.0); // ceil(10 * 0.99) = 10
        assert!(LatencyStats::from_samples(&[1.0, 2.0]).is_none());
        assert!(LatencyStats::from_samples(&[1.0, f64::NAN, 2.0, 3.0]).is_none());
    }

    #[test]
    fn odd_count_median_and_timestamps() {
        let starts = [0.0, 2.0, 4.0, 8.0, 10.0, 12.0, 14.0, 16.0];
        // gaps 2,2,4,2,2,2,2 halved: 1,1,2,1,1,1,1 -> sorted 1x6,2 ; drop 2 -> 5 kept
        let s = LatencyStats::from_samples(&gaps(&starts, 2.0)).unwrap();
        assert_eq!(s.samples, 5);
        assert_eq!(s.median, 1.0);
        assert_eq!(s.max, 1.0);
    }

    #[test]
    fn bandwidth_average_and_peak() {
        // 4 messages of 1 MiB, one per 1000 us, the last one slow.
        let posted = [0.0, 1000.0, 2000.0, 3000.0];
        let completed = [1000.0, 2000.0, 3000.0, 9000.0];
        let s = BwStats::compute(1 << 20, &posted, &completed, 1, BwUnit::MegabytesPerSec).unwrap();
        assert!((s.average - 4.0 / 0.009).abs() < 1e-6);
        assert!(
            (s.peak - 1000.0).abs() < 1e-6,
            "best window is 1 MiB per ms"
        );
        assert!((s.msg_rate_mpps - 4.0 / 9000.0).abs() < 1e-12);
        let g = BwStats::compute(1 << 20, &posted, &completed, 1, BwUnit::GigabitsPerSec).unwrap();
        assert!((g.average - (4.0 * 1048576.0 * 8.0 / 0.009) / 1e9).abs() < 1e-9);
        assert!(BwStats::compute(1, &[], &[], 1, BwUnit::MegabytesPerSec).is_none());
    }

    /// A send_bw server sees receive completions in bursts: 16 arrive in one poll with the
    /// same timestamp. Treating the previous completion as a "post" made a 16-message burst
    /// look instantaneous and the peak absurd (100+ GB/s against 450 MB/s); perftest does
    /// not measure a peak there, and neither must we.
    #[test]
    fn receive_bursts_give_no_peak_only_the_average() {
        // 160 messages of 64 KiB, in 10 bursts of 16 one ms apart: 10 MiB in 9 ms.
        let mut times = BwTimes::new(1, false);
        times.posted(0, 0.0);
        for burst in 0..10u64 {
            let now = burst as f64 * 1000.0;
            times.completed(0, burst * 16, burst * 16 + 15, now);
        }
        let s = times.stats(65536, 1, BwUnit::MegabytesPerSec).unwrap();
        assert_eq!(s.peak, 0.0, "perftest reports no peak on the receive side");
        assert_eq!(s.iters, 160);
        assert!((s.average - 10.0 / 0.009).abs() < 1e-6, "{}", s.average);
        assert!(s.peak <= s.average);
    }

    /// Two threads' times on one clock: the merged run counts every message of both over
    /// the first post of either to the last completion of either, and one part merges into
    /// the same figures it had.
    #[test]
    fn threads_merge_over_the_common_interval() {
        let part = |offset: f64, peak: bool| {
            let mut t = BwTimes::new(1, peak);
            for k in 0..4 {
                t.posted(0, offset + k as f64 * 100.0);
            }
            t.completed(0, 0, 3, offset + 500.0);
            t
        };
        for peak in [false, true] {
            let (a, b) = (part(0.0, peak), part(250.0, peak));
            let all = BwTimes::merged(&[a.clone(), b.clone()]);
            let s = all.stats(1 << 20, 1, BwUnit::MegabytesPerSec).unwrap();
            assert_eq!(s.iters, 8);
            // 8 messages from 0 to 750 us.
            assert!((s.msg_rate_mpps - 8.0 / 750.0).abs() < 1e-12, "{s:?}");
            let one = a.stats(1 << 20, 1, BwUnit::MegabytesPerSec).unwrap();
            let merged_one = BwTimes::merged(&[a])
                .stats(1 << 20, 1, BwUnit::MegabytesPerSec)
                .unwrap();
            assert_eq!(one, merged_one);
            let two = b.stats(1 << 20, 1, BwUnit::MegabytesPerSec).unwrap();
            assert!(s.msg_rate_mpps <= one.msg_rate_mpps + two.msg_rate_mpps);
        }
        assert!(BwTimes::merged(&[])
            .stats(1, 1, BwUnit::MegabytesPerSec)
            .is_none());
    }

    /// Threads merged, where the message posted last is not the one completed last: the
    /// aggregate still spans the last completion of any, so it never beats the sum of the
    /// threads' own rates (with the per-message times kept, as without them).
    #[test]
    fn merged_average_ends_at_the_last_completion_of_any_thread() {
        let part = |post_at: f64, done_at: f64, peak: bool| {
            let mut t = BwTimes::new(1, peak);
            t.posted(0, post_at);
            t.posted(0, post_at + 10.0);
            t.completed(0, 0, 1, done_at);
            t
        };
        for peak in [false, true] {
            // A posts first and completes last; B posts last and completes first.
            let (a, b) = (part(0.0, 1000.0, peak), part(100.0, 200.0, peak));
            let unit = BwUnit::MegabytesPerSec;
            let all = BwTimes::merged(&[a.clone(), b.clone()])
                .stats(64, 1, unit)
                .unwrap();
            assert!((all.msg_rate_mpps - 4.0 / 1000.0).abs() < 1e-12, "{all:?}");
            let sum = a.stats(64, 1, unit).unwrap().msg_rate_mpps
                + b.stats(64, 1, unit).unwrap().msg_rate_mpps;
            assert!(all.msg_rate_mpps <= sum, "{} > {sum}", all.msg_rate_mpps);
        }
    }

    /// The client's peak with synthetic times, as perftest's print_report_bw computes it:
    /// windows start at a post and end at a signalled completion (every cq_mod-th and the
    /// last), and no window beats the rate the timings allow.
    #[test]
    fn client_peak_is_bounded_by_the_fastest_window() {
        let mut times = BwTimes::new(1, true);
        // 8 messages posted 100 us apart, cq_mod 4: completions at messages 3 and 7.
        for k in 0..8 {
            times.posted(0, k as f64 * 100.0);
        }
        times.completed(0, 0, 3, 500.0);
        times.completed(0, 4, 7, 1300.0);
        let s = times.stats(1 << 20, 4, BwUnit::MegabytesPerSec).unwrap();
        // Best window: posted[0] = 0 .. completed[3] = 500, 4 messages: 125 us each (the
        // whole run is 162.5 us per message, posted[4] .. completed[7] 225).
        assert!((s.peak - 1e6 / 125.0).abs() < 1e-6, "{}", s.peak);
        assert!((s.average - 8.0 / 0.0013).abs() < 1e-6, "{}", s.average);
        assert!(s.peak >= s.average);
        // Without the peak, the same run has the same average and no per-message memory.
        let mut lean = BwTimes::new(1, false);
        for k in 0..8 {
            lean.posted(0, k as f64 * 100.0);
        }
        lean.completed(0, 0, 3, 500.0);
        lean.completed(0, 4, 7, 1300.0);
        assert!(lean.posted.is_empty() && lean.index_of[0].is_empty());
        let l = lean.stats(1 << 20, 4, BwUnit::MegabytesPerSec).unwrap();
        assert_eq!((l.peak, l.iters), (0.0, 8));
        assert!((l.average - s.average).abs() < 1e-9);
    }
}
