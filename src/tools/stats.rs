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

/// Samples perftest drops from the top before computing latency statistics.
pub const LAT_MEASURE_TAIL: usize = 2;

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
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

    /// From the timestamps (µs) of each iteration's start: gaps divided by `rtt_factor`.
    pub fn from_timestamps(starts_usec: &[f64], rtt_factor: f64) -> Option<Self> {
        let gaps: Vec<f64> = starts_usec
            .windows(2)
            .map(|w| (w[1] - w[0]) / rtt_factor)
            .collect();
        Self::from_samples(&gaps)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = LatencyStats::from_timestamps(&starts, 2.0).unwrap();
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
}
