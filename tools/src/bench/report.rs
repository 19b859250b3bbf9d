//! What a bench run found, as values (serialised as the JSON report): the machine, each
//! section's rows and the ratios between them; and reading the tools' own outputs.

use anyhow::{bail, Context};
use serde::Serialize;

use super::child::QpMemory;

use super::*;

/// Facts about the machine, taken at the start.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// When the run started (UTC).
    pub started_utc: String,
    /// Online CPUs.
    pub cores: usize,
    /// CPU model.
    pub cpu: String,
    /// Kernel release.
    pub kernel: String,
    /// /proc/loadavg's 1, 5 and 15 minute averages at the start.
    pub load_average: [f64; 3],
    /// The same at the end of the run.
    pub load_average_end: [f64; 3],
    /// "release" or "debug" (a debug build's figures mean little).
    pub build: &'static str,
    /// The AF_XDP mode the ceiling's sockets ran in ("xdp-copy" on veth), if measured.
    pub xdp_mode: Option<String>,
    /// How the endpoints are joined.
    pub link: String,
    /// How often a spinning thread lost its core, measured at the start.
    pub hiccups: Option<super::hiccups::Hiccups>,
}

/// One veth pair of the run.
#[derive(Debug, Clone, Serialize)]
pub struct LinkFacts {
    /// Link MTU.
    pub mtu: u32,
    /// xroce's path MTU on it.
    pub path_mtu: u32,
    /// Receive and transmit queues per end.
    pub queues: u32,
    /// What ran on it.
    pub used_for: String,
}

/// One direction of a one-way stream.
#[derive(Debug, Clone, Serialize)]
pub struct StreamRow {
    /// Link MTU.
    pub link_mtu: u32,
    /// "A->B" or "B->A".
    pub direction: &'static str,
    /// Payload bytes per packet (RoCE payload, or UDP payload).
    pub payload: u64,
    /// Bytes per Ethernet frame (without FCS).
    pub frame_bytes: u64,
    /// Packets the sender handed over.
    pub sent: u64,
    /// Packets the receiver got.
    pub received: u64,
    /// 100 x (1 - received / sent).
    pub loss_percent: f64,
    /// Packets per second at the receiver, first to last.
    pub packets_per_sec: f64,
    /// Packets per second the sender handed over (what sockperf's throughput mode prints).
    pub sender_packets_per_sec: f64,
    /// Ethernet frame bits per second at the receiver / 10^9.
    pub wire_gbps: f64,
    /// Payload bits per second at the receiver / 10^9.
    pub payload_gbps: f64,
}

/// One ping-pong row.
#[derive(Debug, Clone, Serialize)]
pub struct PingRow {
    /// Link MTU.
    pub link_mtu: u32,
    /// How both ends waited.
    pub mode: Progress,
    /// Payload bytes each way.
    pub payload: u64,
    /// Round trips answered.
    pub round_trips: u64,
    /// Pings not answered in time.
    pub lost: u64,
    /// Median round trip (µs).
    pub rtt_median_us: f64,
    /// 99th percentile round trip (µs).
    pub rtt_p99_us: f64,
    /// Half the median round trip: what sockperf and ib_send_lat print as latency (µs).
    pub half_rtt_median_us: f64,
    /// Half the 99th percentile round trip (µs).
    pub half_rtt_p99_us: f64,
}

/// A ceiling or UDP section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RawSection {
    /// One-way streams, both directions.
    pub streams: Vec<StreamRow>,
    /// Ping-pongs.
    pub pingpongs: Vec<PingRow>,
}

/// An xroce figure divided by the reference figure it is compared with.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// Which row of which section the reference is.
    pub reference: String,
    /// The reference figure.
    pub reference_value: f64,
    /// The xroce figure.
    pub value: f64,
    /// value / reference_value.
    pub ratio: f64,
}

impl Ratio {
    pub(super) fn new(reference: String, reference_value: f64, value: f64) -> Option<Ratio> {
        (reference_value > 0.0 && reference_value.is_finite()).then(|| Ratio {
            reference,
            reference_value,
            value,
            ratio: value / reference_value,
        })
    }
}

/// Median and 99th percentile compared with a reference ping-pong.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRatios {
    /// Median / reference median.
    pub median: Ratio,
    /// p99 / reference p99.
    pub p99: Ratio,
}

/// One bandwidth row of xroce.
#[derive(Debug, Clone, Serialize)]
pub struct XroceBwRow {
    /// The perf test.
    pub test: &'static str,
    /// Link MTU.
    pub link_mtu: u32,
    /// Path MTU.
    pub path_mtu: u32,
    /// Message size.
    pub size: u64,
    /// QPs.
    pub qps: usize,
    /// Messages per QP.
    pub iters: u64,
    /// Average payload Gbit/s (perf's BW average with --report_gbits).
    pub gbps: f64,
    /// perf's BW peak (0 when perftest would not measure it).
    pub peak_gbps: f64,
    /// Million messages per second.
    pub msg_rate_mpps: f64,
    /// Payload Gbit/s / the raw AF_XDP stream's, same payload per packet and direction.
    pub vs_ceiling: Option<Ratio>,
    /// Payload Gbit/s / the kernel UDP stream's, same payload per packet and direction.
    pub vs_udp: Option<Ratio>,
}

/// The engine alone: 64-byte SENDs between two engines joined in memory on one core.
#[derive(Debug, Clone, Serialize)]
pub struct EngineSection {
    /// Message size.
    pub size: u64,
    /// Messages delivered in the timed part.
    pub messages: u64,
    /// Its length.
    pub seconds: f64,
    /// Messages per second, in millions.
    pub msg_rate_mpps: f64,
    /// The rate in each tenth of the timed part, in order (M msg/s): their spread shows
    /// whether the machine's speed drifted during the row.
    pub tenths_mpps: Vec<f64>,
}

/// One latency row of xroce.
#[derive(Debug, Clone, Serialize)]
pub struct XroceLatRow {
    /// The perf test.
    pub test: &'static str,
    /// Progress mode.
    pub mode: Progress,
    /// Link MTU.
    pub link_mtu: u32,
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// "half round trip" (send_lat, write_lat) or "round trip" (read_lat), as perftest.
    pub measures: &'static str,
    /// perf's t_typical (µs).
    pub median_us: f64,
    /// perf's 99% percentile (µs).
    pub p99_us: f64,
    /// Against the raw AF_XDP ping-pong of the same size and mode.
    pub vs_ceiling: Option<LatencyRatios>,
    /// Against the kernel UDP ping-pong of the same size and mode.
    pub vs_udp: Option<LatencyRatios>,
}

/// The xroce section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct XroceSection {
    /// Bandwidth rows.
    pub bw: Vec<XroceBwRow>,
    /// Latency rows.
    pub lat: Vec<XroceLatRow>,
}

/// One row of the library section: the same test, size and count through perftest on
/// xroce's `libibverbs.so.1` and through `xroce perf`, one after the other.
#[derive(Debug, Clone, Serialize)]
pub struct LibraryRow {
    /// The test (`write_bw`: perftest's `ib_write_bw`).
    pub test: &'static str,
    /// Message size.
    pub size: u64,
    /// Messages (bandwidth) or round trips (latency).
    pub iters: u64,
    /// "Gbit/s" (BW average) or "us" (t_typical).
    pub unit: &'static str,
    /// perftest's figure.
    pub perftest: f64,
    /// `xroce perf`'s figure.
    pub xroce_perf: f64,
    /// perftest / xroce perf (for latency, above 1 is slower).
    pub ratio: f64,
    /// Within 10% of each other (the target of issue 14).
    pub within_10_percent: bool,
}

impl LibraryRow {
    pub(super) fn new(case: &BwCase, perftest: PerfResult, perf: PerfResult) -> LibraryRow {
        let (unit, p, x) = match (perftest, perf) {
            (PerfResult::Lat { median: p, .. }, PerfResult::Lat { median: x, .. }) => ("us", p, x),
            (PerfResult::Bw { gbps: p, .. }, PerfResult::Bw { gbps: x, .. }) => ("Gbit/s", p, x),
            (p, x) => ("mismatch", p.figure(), x.figure()),
        };
        let ratio = if x > 0.0 { p / x } else { 0.0 };
        LibraryRow {
            test: case.test,
            size: case.size,
            iters: case.iters,
            unit,
            perftest: p,
            xroce_perf: x,
            ratio,
            within_10_percent: (0.9..=1.1).contains(&ratio),
        }
    }
}

/// The library section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LibrarySection {
    /// One row per case.
    pub rows: Vec<LibraryRow>,
}

/// Reads perftest's result row (the line after the `#bytes` header): for a bandwidth test
/// with `--report_gbits`, its BW average (Gbit/s); for a latency test, its t_typical (us).
pub fn parse_perftest(text: &str, latency: bool) -> anyhow::Result<PerfResult> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let header = lines.next().context("perftest printed no #bytes header")?;
    let row = lines
        .find(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .with_context(|| format!("perftest printed no result row after {header:?}"))?;
    let cols: Vec<f64> = row
        .split_whitespace()
        .map(|c| c.parse::<f64>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("perftest's result row {row:?}"))?;
    if latency {
        // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
        let (median, p99) = (cols.get(4), cols.get(7));
        match (median, p99) {
            (Some(&median), Some(&p99)) => Ok(PerfResult::Lat { median, p99 }),
            _ => bail!("perftest's latency row {row:?} has too few columns"),
        }
    } else {
        // #bytes #iterations BW_peak BW_average MsgRate
        match (cols.get(2), cols.get(3), cols.get(4)) {
            (Some(&peak_gbps), Some(&gbps), Some(&msg_rate_mpps)) => Ok(PerfResult::Bw {
                gbps,
                peak_gbps,
                msg_rate_mpps,
            }),
            _ => bail!("perftest's bandwidth row {row:?} has too few columns"),
        }
    }
}

/// One scale row.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    /// Message size.
    pub size: u64,
    /// QPs.
    pub qps: usize,
    /// Messages per QP.
    pub iters: u64,
    /// Aggregate payload Gbit/s.
    pub gbps: f64,
    /// Aggregate million messages per second.
    pub msg_rate_mpps: f64,
    /// Against the same size with one QP.
    pub vs_one_qp: Option<Ratio>,
    /// Against the raw AF_XDP stream of the same payload per packet.
    pub vs_ceiling: Option<Ratio>,
}

/// The scale section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScaleSection {
    /// Link MTU of the scale rows.
    pub link_mtu: u32,
    /// Throughput with N QPs.
    pub rows: Vec<ScaleRow>,
    /// Memory per QP.
    pub memory: Vec<QpMemory>,
    /// How the memory was measured.
    pub memory_method: String,
}

/// One threads row: a message rate, or why there is none.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadsRow {
    /// write_bw or send_bw.
    pub test: &'static str,
    /// Message size.
    pub size: u64,
    /// QPs (split over the threads).
    pub qps: usize,
    /// `--threads` on both sides.
    pub threads: usize,
    /// `--shards` on both sides.
    pub shards: u32,
    /// Messages per QP.
    pub iters: u64,
    /// Aggregate million messages per second (the client's), if it ran.
    pub msg_rate_mpps: Option<f64>,
    /// Aggregate payload Gbit/s, if it ran.
    pub gbps: Option<f64>,
    /// Each client thread's own message rate.
    pub per_thread_mpps: Vec<f64>,
    /// Against the same test with one thread and one shard.
    pub vs_one_thread: Option<Ratio>,
    /// Why the row has no figures (the run failed: its error).
    pub error: Option<String>,
}

/// The threads section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ThreadsSection {
    /// Link MTU.
    pub link_mtu: u32,
    /// Queues per veth end.
    pub queues: u32,
    /// The rows, test by test.
    pub rows: Vec<ThreadsRow>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine.
    pub machine: Machine,
    /// `--quick`.
    pub quick: bool,
    /// Sections run.
    pub sections: Vec<Section>,
    /// Progress modes of the latency rows.
    pub progress: Vec<Progress>,
    /// The veth pairs.
    pub links: Vec<LinkFacts>,
    /// Raw AF_XDP.
    pub ceiling: Option<RawSection>,
    /// Kernel UDP.
    pub udp: Option<RawSection>,
    /// xroce perf.
    pub xroce: Option<XroceSection>,
    /// Many QPs.
    pub scale: Option<ScaleSection>,
    /// One thread and two.
    pub threads: Option<ThreadsSection>,
    /// perftest through the library beside `xroce perf`.
    pub library: Option<LibrarySection>,
    /// The engine alone.
    pub engine: Option<EngineSection>,
    /// The data path's targets, as ratios of this run's figures.
    pub targets: Vec<targets::Target>,
    /// How to read the figures, and what was left out.
    pub notes: Vec<String>,
    /// Measurements that failed (each also missing from its table).
    pub failures: Vec<String>,
    /// Wall time of the run.
    pub seconds: f64,
}
