//! `xroce bench`: the limit, the alternative and xroce, measured side by side in one run on
//! veth pairs between two namespaces that the run creates and removes.
//!
//! 1. **Ceiling**: raw AF_XDP frames of RoCE sizes (RC RDMA WRITE_ONLY frames built with
//!    `xroce::wire`) through the same [`XdpDriver`](xroce::driver::xdp::XdpDriver) the verbs
//!    layer uses, no engine: a one-way stream each way (rate at the receiver, loss), and a
//!    ping-pong.
//! 2. **Kernel UDP** between the same two addresses (`std::net::UdpSocket`): a one-way
//!    stream of the same payload per packet each way, and a ping-pong.
//! 3. **xroce**: `xroce perf` servers in namespace B and clients in A, the bandwidth tests
//!    from 64 B to 1 MiB with one QP and with 16, the latency tests at 64 B and 4 KiB in each
//!    progress mode; every figure also as a ratio to the ceiling and to kernel UDP.
//! 4. **Scale**: `write_bw` with 1, 16, 256 and 1024 QPs, and what each QP costs in memory.
//! 5. **Threads**: `write_bw` and `send_bw` at 64 B with 2 QPs on one thread and on two
//!    (`perf --threads`), with one engine shard and with two (`--shards`), on a veth pair
//!    with 2 queues per end; message rates side by side with the ratio to one thread.
//!
//! The rows at 4 KiB run on a second veth pair at a jumbo MTU (9000 unless `--mtu`), where
//! one 4 KiB message is one packet; everything else on a pair at MTU 1500.
//!
//! Every process that sends or receives runs inside a namespace: this executable again as
//! `xroce bench-child '<json spec>'` ([`child`]), or `xroce perf`.
pub mod child;
pub mod targets;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::options::in_range;
use child::{ChildRole, ChildSpec, Pinged, QpMemory, Received, Sent};
use xroce::engine::Mtu;
use xroce::netns::{LinkConfig, Netns, VethLink};

/// The MTU of the main veth pair.
pub const BASE_MTU: u32 = 1500;
/// The smallest jumbo MTU: a 4096-byte path MTU needs 4096 + 80 bytes of headers.
pub const MIN_JUMBO_MTU: u32 = 4096 + xroce::engine::ROCE_HEADER_ALLOWANCE;
/// The largest jumbo MTU: the AF_XDP driver joins at most 4 chunks into one frame.
pub const MAX_JUMBO_MTU: u32 = 9000;
/// `-n/--iters` (round trips per latency row): enough for a 99th percentile.
pub const MIN_LAT_ITERS: u64 = 100;
/// `-n/--iters` upper bound: perf's latency limit (one timestamp per iteration).
pub const MAX_LAT_ITERS: u64 = crate::perftest::run::MAX_LAT_ITERS;
/// `--messages` lower bound.
pub const MIN_MESSAGES: u64 = 100;
/// `--messages` upper bound.
pub const MAX_MESSAGES: u64 = 100_000_000;
/// The message sizes of the bandwidth rows (the full run).
pub const FULL_BW_SIZES: [u64; 8] = [
    64,
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];
/// QP counts of the bandwidth rows: one, and many.
pub const BW_QPS: [usize; 2] = [1, 16];
/// QP counts of the scale rows.
pub const SCALE_QPS: [usize; 4] = [1, 16, 256, 1024];
/// The sizes of the latency rows.
pub const LAT_SIZES: [u64; 2] = [64, 4096];
/// The three bandwidth tests.
pub const BW_TESTS: [&str; 3] = ["write_bw", "send_bw", "read_bw"];
/// The three latency tests.
pub const LAT_TESTS: [&str; 3] = ["send_lat", "write_lat", "read_lat"];
/// The threads section's (threads, shards) runs; thread counts are also the QPs' divisor.
pub const THREAD_RUNS: [(usize, u32); 3] = [(1, 1), (2, 1), (2, 2)];
/// The threads section's tests (64 B messages: the message rate is what threads can raise).
pub const THREAD_TESTS: [&str; 2] = ["write_bw", "send_bw"];
/// QPs of every threads row: the same in each, so only the threads and shards differ.
pub const THREAD_QPS: usize = 2;
/// Queues per veth end of the threads section's pair: one per shard of the largest run.
pub const THREAD_QUEUES: u32 = 2;
/// The message size of the threads rows.
pub const THREAD_SIZE: u64 = 64;
/// TCP port of the perftest exchanges (inside the bench's own namespaces).
const PERF_PORT: u16 = 18515;
/// perftest's port in the library section (its own default, kept apart from the perf rows').
const PERFTEST_PORT: u16 = 18516;

/// How long a child may take to say READY (opening an AF_XDP socket, loading the program).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A part of the run (`--sections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    /// Raw AF_XDP frames, no engine.
    Ceiling,
    /// Kernel UDP sockets.
    Udp,
    /// `xroce perf`.
    Xroce,
    /// `write_bw` with up to 1024 QPs, and memory per QP.
    Scale,
    /// `perf --threads` and `--shards`: message rates with one thread and two.
    Threads,
    /// perftest's binaries on xroce's `libibverbs.so.1` (through `xroce run`) beside
    /// `xroce perf`'s same test.
    Library,
}

impl Section {
    /// Every section, in the order they print.
    pub const ALL: [Section; 6] = [
        Section::Ceiling,
        Section::Udp,
        Section::Xroce,
        Section::Scale,
        Section::Threads,
        Section::Library,
    ];

    /// The name `--sections` takes.
    pub fn name(self) -> &'static str {
        match self {
            Section::Ceiling => "ceiling",
            Section::Udp => "udp",
            Section::Xroce => "xroce",
            Section::Scale => "scale",
            Section::Threads => "threads",
            Section::Library => "library",
        }
    }
}

/// How the latency rows wait for a packet (`--progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Progress {
    /// Sleep until the socket is readable: poll(2) (AF_XDP), a blocking recv (UDP), xroce's
    /// progress thread woken by its driver.
    #[serde(rename = "wakeup")]
    Wakeup,
    /// Spin on the socket: AF_XDP and UDP poll without sleeping, xroce `--progress busy-poll`.
    #[serde(rename = "busy-poll")]
    BusyPoll,
}

impl Progress {
    /// The name `--progress` takes (bench and perf alike).
    pub fn name(self) -> &'static str {
        match self {
            Progress::Wakeup => "wakeup",
            Progress::BusyPoll => "busy-poll",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Sections to run.
    pub sections: Vec<Section>,
    /// Few sizes, few iterations.
    pub quick: bool,
    /// Progress modes of the latency rows.
    pub modes: Vec<Progress>,
    /// Whether `modes` was asked for (not the default).
    pub modes_explicit: bool,
    /// MTU of the second veth pair (the 4 KiB rows).
    pub jumbo_mtu: u32,
    /// Round trips per latency row (default 20000, quick 2000).
    pub lat_iters: Option<u64>,
    /// Most messages per bandwidth row (default 200000, quick 20000; larger messages fewer).
    pub messages: Option<u64>,
    /// `xroce perf` takes `--progress` (the CLI knows; older builds lack it).
    pub perf_has_progress: bool,
    /// `--shards`: the engine shards of the xroce and scale sections' devices (their veth
    /// pairs then get as many queues); the threads section runs its own.
    pub shards: u32,
    /// The xroce executable (children and `xroce perf`).
    pub exe: PathBuf,
}

impl BenchOptions {
    /// The defaults: every section but the library one, both progress modes, MTU 9000 for
    /// the 4 KiB rows.
    pub fn new(exe: PathBuf) -> Self {
        BenchOptions {
            // The library section needs Debian's perftest: asked for by name only.
            sections: Section::ALL
                .into_iter()
                .filter(|s| *s != Section::Library)
                .collect(),
            quick: false,
            modes: vec![Progress::Wakeup, Progress::BusyPoll],
            modes_explicit: false,
            jumbo_mtu: MAX_JUMBO_MTU,
            lat_iters: None,
            messages: None,
            perf_has_progress: true,
            shards: 1,
            exe,
        }
    }

    /// Checks every option; messages name the option and its range.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.sections.is_empty() {
            bail!("--sections: name at least one of ceiling, udp, xroce, scale, threads, library");
        }
        if self.modes.is_empty() {
            bail!("--progress: choose wakeup, busy-poll or both");
        }
        in_range(
            "--mtu",
            self.jumbo_mtu,
            MIN_JUMBO_MTU,
            MAX_JUMBO_MTU,
            "the link of the 4 KiB rows: path MTU 4096 needs 4096 + 80 bytes, and the AF_XDP driver joins at most 4 chunks of 4096",
        )?;
        if let Some(n) = self.lat_iters {
            in_range(
                "-n/--iters",
                n,
                MIN_LAT_ITERS,
                MAX_LAT_ITERS,
                "round trips per latency row: a 99th percentile needs at least 100",
            )?;
        }
        if let Some(m) = self.messages {
            in_range(
                "--messages",
                m,
                MIN_MESSAGES,
                MAX_MESSAGES,
                "messages per bandwidth row",
            )?;
        }
        in_range(
            "--shards",
            self.shards,
            1,
            xroce::verbs::MAX_SHARDS,
            "engine shards of the xroce and scale sections' devices, and queues of their veth pairs",
        )?;
        if self.modes_explicit
            && self.modes.contains(&Progress::BusyPoll)
            && !self.perf_has_progress
        {
            bail!("--progress busy-poll: this xroce perf has no --progress option yet, so xroce cannot busy-poll; use --progress wakeup");
        }
        Ok(())
    }

    /// Round trips per latency row.
    pub fn lat_iters(&self) -> u64 {
        self.lat_iters
            .unwrap_or(if self.quick { 2_000 } else { 20_000 })
    }

    /// Messages per bandwidth row of `size` bytes: the maximum for small messages, fewer
    /// for large ones (about 2 KiB x the maximum in bytes), never below 100.
    pub fn messages_for(&self, size: u64) -> u64 {
        let max = self
            .messages
            .unwrap_or(if self.quick { 20_000 } else { 200_000 });
        (max.saturating_mul(2048) / size.max(1)).clamp(MIN_MESSAGES.min(max), max)
    }

    fn runs(&self, s: Section) -> bool {
        self.sections.contains(&s)
    }
}

/// One bandwidth run of `xroce perf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwCase {
    /// write_bw, send_bw or read_bw.
    pub test: &'static str,
    /// Message size.
    pub size: u64,
    /// `-q`.
    pub qps: usize,
    /// `-n` (per QP, as perftest counts it).
    pub iters: u64,
    /// `--threads` (both sides).
    pub threads: usize,
    /// `--shards` (both sides).
    pub shards: u32,
}

/// One latency run of `xroce perf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatCase {
    /// send_lat, write_lat or read_lat.
    pub test: &'static str,
    /// Message size.
    pub size: u64,
    /// Progress mode.
    pub mode: Progress,
    /// `-n`.
    pub iters: u64,
}

/// What runs on one veth pair.
#[derive(Debug, Clone)]
pub struct LinkPlan {
    /// Link MTU.
    pub mtu: u32,
    /// The path MTU xroce uses on it.
    pub path_mtu: u32,
    /// Payload sizes of the stream rows (ceiling and UDP): the payload per packet of the
    /// bandwidth rows' messages.
    pub stream_payloads: Vec<u64>,
    /// Payload sizes of the ping-pong rows.
    pub ping_sizes: Vec<u64>,
    /// Bandwidth runs.
    pub bw: Vec<BwCase>,
    /// Latency runs.
    pub lat: Vec<LatCase>,
    /// Scale runs (write_bw with many QPs).
    pub scale: Vec<BwCase>,
    /// Threads runs (`--threads`, `--shards`).
    pub threads: Vec<BwCase>,
    /// perftest through the library, each beside `xroce perf`'s same case.
    pub library: Vec<BwCase>,
    /// Receive and transmit queues per veth end.
    pub queues: u32,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The veth pairs, in order.
    pub links: Vec<LinkPlan>,
    /// QP counts whose memory is measured.
    pub memory_qps: Vec<usize>,
}

/// The path MTU xroce picks on a link of `link_mtu` (rxe's rule).
pub fn path_mtu(link_mtu: u32) -> u32 {
    Mtu::for_link_mtu(link_mtu).map_or(256, Mtu::bytes)
}

/// The scale rows' message sizes (full run; quick uses the first).
pub const SCALE_SIZES: [u64; 2] = [64, 4096];

/// The library section's cases: write_bw at 64 B and 64 KiB, send_bw at 64 B, send_lat at
/// 64 B (quick: the first two), on the base link, in the default progress mode.
fn library_cases(opts: &BenchOptions) -> Vec<BwCase> {
    if !opts.runs(Section::Library) {
        return Vec::new();
    }
    let case = |test, size: u64| BwCase {
        test,
        size,
        qps: 1,
        iters: if test.ends_with("_lat") {
            opts.lat_iters()
        } else {
            opts.messages_for(size).max(crate::perftest::run::MIN_ITERS)
        },
        threads: 1,
        shards: 1,
    };
    let all = [
        case("write_bw", 64),
        case("write_bw", 65536),
        case("send_bw", 64),
        case("send_lat", 64),
    ];
    all[..if opts.quick { 2 } else { 4 }].to_vec()
}

/// What `opts` runs, link by link.
pub fn plan(opts: &BenchOptions) -> Plan {
    let lat = |size: u64| -> Vec<LatCase> {
        if !opts.runs(Section::Xroce) {
            return Vec::new();
        }
        let mut v = Vec::new();
        for &mode in &opts.modes {
            // Without perf's --progress only its default (wakeup) can run.
            if mode == Progress::BusyPoll && !opts.perf_has_progress {
                continue;
            }
            for test in LAT_TESTS {
                v.push(LatCase {
                    test,
                    size,
                    mode,
                    iters: opts.lat_iters(),
                });
            }
        }
        v
    };
    let bw_case = |test, size, qps: usize| BwCase {
        test,
        size,
        qps,
        iters: (opts.messages_for(size) / qps as u64).max(crate::perftest::run::MIN_ITERS),
        threads: 1,
        shards: opts.shards,
    };
    let mut base_bw = Vec::new();
    let mut jumbo_bw = Vec::new();
    if opts.runs(Section::Xroce) {
        if opts.quick {
            for test in BW_TESTS {
                base_bw.push(bw_case(test, 64, 1));
            }
            base_bw.push(bw_case("write_bw", 64, 16));
            jumbo_bw.push(bw_case("write_bw", 4096, 1));
        } else {
            for test in BW_TESTS {
                for qps in BW_QPS {
                    for size in FULL_BW_SIZES {
                        base_bw.push(bw_case(test, size, qps));
                    }
                    jumbo_bw.push(bw_case(test, 4096, qps));
                }
            }
        }
    }
    let mut scale = Vec::new();
    if opts.runs(Section::Scale) {
        let sizes: &[u64] = if opts.quick {
            &SCALE_SIZES[..1]
        } else {
            &SCALE_SIZES
        };
        for &size in sizes {
            for qps in SCALE_QPS {
                // At least 20 messages per QP, so every QP's pipeline fills.
                let total = opts.messages_for(size).max(20 * qps as u64);
                scale.push(BwCase {
                    test: "write_bw",
                    size,
                    qps,
                    iters: (total / qps as u64).max(crate::perftest::run::MIN_ITERS),
                    threads: 1,
                    shards: opts.shards,
                });
            }
        }
    }
    let base_pmtu = path_mtu(BASE_MTU);
    let jumbo_pmtu = path_mtu(opts.jumbo_mtu);
    let raw = opts.runs(Section::Ceiling) || opts.runs(Section::Udp);
    let mut base_payloads: Vec<u64> = if opts.quick {
        vec![64]
    } else {
        FULL_BW_SIZES
            .iter()
            .map(|&s| s.min(u64::from(base_pmtu)))
            .collect()
    };
    if !opts.quick && opts.runs(Section::Scale) {
        base_payloads.extend(SCALE_SIZES.iter().map(|&s| s.min(u64::from(base_pmtu))));
    }
    base_payloads.sort_unstable();
    base_payloads.dedup();
    let base = LinkPlan {
        mtu: BASE_MTU,
        path_mtu: base_pmtu,
        stream_payloads: if raw { base_payloads } else { Vec::new() },
        ping_sizes: if raw { vec![LAT_SIZES[0]] } else { Vec::new() },
        bw: base_bw,
        lat: lat(LAT_SIZES[0]),
        scale,
        threads: Vec::new(),
        library: library_cases(opts),
        queues: opts.shards,
    };
    let jumbo = LinkPlan {
        mtu: opts.jumbo_mtu,
        path_mtu: jumbo_pmtu,
        stream_payloads: if raw { vec![4096] } else { Vec::new() },
        ping_sizes: if raw { vec![LAT_SIZES[1]] } else { Vec::new() },
        bw: jumbo_bw,
        lat: lat(LAT_SIZES[1]),
        scale: Vec::new(),
        threads: Vec::new(),
        library: Vec::new(),
        queues: opts.shards,
    };
    let mut threads = Vec::new();
    if opts.runs(Section::Threads) {
        for test in THREAD_TESTS {
            for (t, shards) in THREAD_RUNS {
                threads.push(BwCase {
                    threads: t,
                    shards,
                    ..bw_case(test, THREAD_SIZE, THREAD_QPS)
                });
            }
        }
    }
    let multi_queue = LinkPlan {
        mtu: BASE_MTU,
        path_mtu: base_pmtu,
        stream_payloads: Vec::new(),
        ping_sizes: Vec::new(),
        bw: Vec::new(),
        lat: Vec::new(),
        scale: Vec::new(),
        threads,
        library: Vec::new(),
        queues: THREAD_QUEUES,
    };
    let used = |l: &LinkPlan| {
        !(l.stream_payloads.is_empty()
            && l.bw.is_empty()
            && l.lat.is_empty()
            && l.scale.is_empty()
            && l.threads.is_empty()
            && l.library.is_empty())
    };
    let links = [base, jumbo, multi_queue]
        .into_iter()
        .filter(used)
        .collect();
    let memory_qps = if opts.runs(Section::Scale) {
        SCALE_QPS.to_vec()
    } else {
        Vec::new()
    };
    Plan { links, memory_qps }
}

// ---------------------------------------------------------------------------------------
// The report.

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
    fn new(reference: String, reference_value: f64, value: f64) -> Option<Ratio> {
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
    fn new(case: &BwCase, perftest: PerfResult, perf: PerfResult) -> LibraryRow {
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
    /// The data path's targets, as ratios of this run's figures.
    pub targets: Vec<targets::Target>,
    /// How to read the figures, and what was left out.
    pub notes: Vec<String>,
    /// Measurements that failed (each also missing from its table).
    pub failures: Vec<String>,
    /// Wall time of the run.
    pub seconds: f64,
}

// ---------------------------------------------------------------------------------------
// Running.

/// A child process whose stdout lines arrive on a channel and whose stderr is collected;
/// killed and reaped when dropped.
struct Proc {
    child: std::process::Child,
    what: String,
    lines: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(
        ns: &Netns,
        exe: &std::path::Path,
        args: &[String],
        what: String,
    ) -> anyhow::Result<Proc> {
        let mut cmd = ns.command(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Self::start(child, what)
    }

    fn spawn_here(exe: &std::path::Path, args: &[String], what: String) -> anyhow::Result<Proc> {
        let mut cmd = std::process::Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Self::start(child, what)
    }

    fn start(mut child: std::process::Child, what: String) -> anyhow::Result<Proc> {
        let stdout = child.stdout.take().context("child stdout")?;
        let mut stderr_pipe = child.stderr.take().context("child stderr")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        Ok(Proc {
            child,
            what,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// The next stdout line, or an error naming the child and what it said on stderr.
    fn line(&self, timeout: Duration) -> anyhow::Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!(
                    "{}: no answer within {:?}{}",
                    self.what,
                    timeout,
                    self.said()
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Give the stderr reader a moment to catch the last words.
                std::thread::sleep(Duration::from_millis(50));
                bail!("{}: exited{}", self.what, self.said())
            }
        }
    }

    fn said(&self) -> String {
        let e = self.stderr_text();
        if e.is_empty() {
            String::new()
        } else {
            format!(": {}", last_lines(&e, 3))
        }
    }

    fn expect_ready(&self) -> anyhow::Result<()> {
        let l = self.line(READY_TIMEOUT)?;
        if l != "READY" {
            bail!("{}: said {l:?} instead of READY", self.what);
        }
        Ok(())
    }

    fn result<T: for<'de> Deserialize<'de>>(&self, timeout: Duration) -> anyhow::Result<T> {
        let l = self.line(timeout)?;
        serde_json::from_str(&l).with_context(|| format!("{}: unreadable result {l:?}", self.what))
    }

    /// Waits for the process to exit; kills it after `timeout`. Returns its stdout.
    fn finish(mut self, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                bail!(
                    "{}: still running after {:?}, killed{}",
                    self.what,
                    timeout,
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(r) = self.stderr_reader.take() {
            let _ = r.join();
        }
        let out: Vec<String> = self.lines.try_iter().collect();
        if !status.success() {
            bail!("{}: {status}{}", self.what, self.said());
        }
        Ok(out.join("\n"))
    }
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// The two sides of a link, as the roles need them.
struct Side<'a> {
    ns: &'a Netns,
    ifname: &'a str,
    ip: std::net::Ipv4Addr,
    mac: [u8; 6],
}

fn sides(link: &VethLink) -> (Side<'_>, Side<'_>) {
    (
        Side {
            ns: &link.a,
            ifname: &link.a_if,
            ip: link.a_ip,
            mac: link.a_mac,
        },
        Side {
            ns: &link.b,
            ifname: &link.b_if,
            ip: link.b_ip,
            mac: link.b_mac,
        },
    )
}

struct Runner<'a> {
    opts: &'a BenchOptions,
    log: &'a mut dyn Write,
    failures: Vec<String>,
    xdp_mode: Option<String>,
    step: usize,
    steps: usize,
}

impl Runner<'_> {
    fn note(&mut self, what: &str) {
        self.step += 1;
        let _ = writeln!(self.log, "[{}/{}] {what}", self.step, self.steps);
        let _ = self.log.flush();
    }

    fn failed(&mut self, what: &str, e: anyhow::Error) {
        let msg = format!("{what}: {e:#}");
        let _ = writeln!(self.log, "  FAILED: {msg}");
        self.failures.push(msg);
    }

    fn child(
        &self,
        side: &Side,
        peer: &Side,
        role: ChildRole,
        size: u64,
        count: u64,
        busy: bool,
    ) -> anyhow::Result<Proc> {
        let spec = ChildSpec {
            role,
            ifname: side.ifname.to_string(),
            local_ip: side.ip,
            peer_ip: peer.ip,
            peer_mac: peer.mac,
            size: size as usize,
            count,
            busy,
            qps: 0,
        };
        let args = vec!["bench-child".to_string(), serde_json::to_string(&spec)?];
        Proc::spawn(
            side.ns,
            &self.opts.exe,
            &args,
            format!("bench-child {role:?} in {}", side.ns.name()),
        )
    }

    /// One direction of a stream: the receiver first, then the sender.
    fn stream(
        &mut self,
        link: &VethLink,
        xdp: bool,
        payload: u64,
        a_to_b: bool,
    ) -> anyhow::Result<StreamRow> {
        let (a, b) = sides(link);
        let (from, to) = if a_to_b { (&a, &b) } else { (&b, &a) };
        let count = self.opts.messages_for(payload);
        let (send_role, recv_role) = if xdp {
            (ChildRole::XdpSend, ChildRole::XdpRecv)
        } else {
            (ChildRole::UdpSend, ChildRole::UdpRecv)
        };
        let rx = self.child(to, from, recv_role, payload, count, false)?;
        rx.expect_ready()?;
        let tx = self.child(from, to, send_role, payload, count, false)?;
        tx.expect_ready()?;
        let sent: Sent = tx.result(Duration::from_secs(300))?;
        let got: Received = rx.result(Duration::from_secs(30))?;
        if xdp {
            self.xdp_mode.get_or_insert(got.mode.clone());
        }
        if got.received == 0 || got.seconds <= 0.0 {
            bail!("the receiver got {} of {} packets", got.received, sent.sent);
        }
        let frame_bytes = if xdp {
            got.bytes / got.received
        } else {
            // Ethernet 14 + IPv4 20 + UDP 8 in front of each datagram (one fragment).
            payload + 42
        };
        let pps = got.received as f64 / got.seconds;
        Ok(StreamRow {
            link_mtu: link.mtu,
            direction: if a_to_b { "A->B" } else { "B->A" },
            payload,
            frame_bytes,
            sent: sent.sent,
            received: got.received,
            loss_percent: 100.0 * (1.0 - got.received as f64 / sent.sent.max(1) as f64),
            packets_per_sec: pps,
            sender_packets_per_sec: sent.sent as f64 / sent.seconds.max(1e-9),
            wire_gbps: pps * frame_bytes as f64 * 8.0 / 1e9,
            payload_gbps: pps * payload as f64 * 8.0 / 1e9,
        })
    }

    /// A ping-pong: the echo in B, the pinger in A.
    fn pingpong(
        &mut self,
        link: &VethLink,
        xdp: bool,
        size: u64,
        mode: Progress,
    ) -> anyhow::Result<PingRow> {
        let (a, b) = sides(link);
        let busy = mode == Progress::BusyPoll;
        let (ping_role, echo_role) = if xdp {
            (ChildRole::XdpPing, ChildRole::XdpEcho)
        } else {
            (ChildRole::UdpPing, ChildRole::UdpEcho)
        };
        let iters = self.opts.lat_iters();
        let echo = self.child(&b, &a, echo_role, size, 0, busy)?;
        echo.expect_ready()?;
        let ping = self.child(&a, &b, ping_role, size, iters, busy)?;
        ping.expect_ready()?;
        let r: Pinged = ping.result(Duration::from_secs(60) + Duration::from_millis(iters))?;
        drop(echo);
        Ok(PingRow {
            link_mtu: link.mtu,
            mode,
            payload: size,
            round_trips: r.answered,
            lost: r.lost,
            rtt_median_us: r.rtt.median,
            rtt_p99_us: r.rtt.p99,
            half_rtt_median_us: r.rtt.median / 2.0,
            half_rtt_p99_us: r.rtt.p99 / 2.0,
        })
    }

    /// One `xroce perf` pair: the server in B, the client in A; the client's first result.
    fn perf(
        &mut self,
        link: &VethLink,
        case: &BwCase,
        mode: Option<Progress>,
    ) -> anyhow::Result<PerfResult> {
        let doc = self.perf_doc(link, case, mode)?;
        parse_perf(&doc).with_context(|| {
            format!(
                "xroce perf {} -s {}: reading its --json",
                case.test, case.size
            )
        })
    }

    /// perftest's binary of `case` on xroce's library: `xroce run -d <veth> -- ib_<test>`,
    /// the server in B, the client in A; the client's result row.
    fn perftest(&mut self, link: &VethLink, case: &BwCase) -> anyhow::Result<PerfResult> {
        let binary = format!("ib_{}", case.test);
        let latency = case.test.ends_with("_lat");
        let args = |ifname: &str| -> Vec<String> {
            let mut v: Vec<String> = ["run", "-d", ifname, "--", &binary, "-d"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.push(format!("xroce_{ifname}"));
            v.extend(
                [
                    "-x",
                    "1",
                    "-s",
                    &case.size.to_string(),
                    "-n",
                    &case.iters.to_string(),
                    "-p",
                    &PERFTEST_PORT.to_string(),
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            if !latency {
                v.push("--report_gbits".into());
            }
            v
        };
        let mut server = Proc::spawn(
            &link.b,
            &self.opts.exe,
            &args(&link.b_if),
            format!("{binary} server on the library"),
        )?;
        // perftest says nothing machine-readable when it listens: give it a moment, and
        // fail at once if it already died.
        std::thread::sleep(Duration::from_millis(700));
        if let Ok(Some(status)) = server.child.try_wait() {
            bail!("{binary} server: {status}{}", server.said());
        }
        let mut client_args = args(&link.a_if);
        client_args.push(link.b_ip.to_string());
        let client = Proc::spawn(
            &link.a,
            &self.opts.exe,
            &client_args,
            format!("{binary} client on the library"),
        )?;
        let out = client.finish(Duration::from_secs(180))?;
        let _ = server.finish(Duration::from_secs(10));
        parse_perftest(&out, latency).with_context(|| format!("{binary} client's output"))
    }

    /// One `xroce perf` pair: the server in B, the client in A; the client's JSON document.
    fn perf_doc(
        &mut self,
        link: &VethLink,
        case: &BwCase,
        mode: Option<Progress>,
    ) -> anyhow::Result<String> {
        let BwCase {
            test,
            size,
            qps,
            iters,
            threads,
            shards,
        } = *case;
        let common = |ifname: &str| {
            let mut v: Vec<String> = [
                "perf",
                test,
                "-d",
                ifname,
                "-s",
                &size.to_string(),
                "-n",
                &iters.to_string(),
                "-p",
                &PERF_PORT.to_string(),
                "--json",
                "--report_gbits",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if qps > 1 {
                v.extend(["-q".to_string(), qps.to_string()]);
            }
            if threads > 1 {
                v.extend(["--threads".to_string(), threads.to_string()]);
            }
            if shards > 1 {
                v.extend(["--shards".to_string(), shards.to_string()]);
            }
            if let (Some(m), true) = (mode, self.opts.perf_has_progress) {
                v.extend(["--progress".to_string(), m.name().to_string()]);
            }
            v
        };
        let mut server = Proc::spawn(
            &link.b,
            &self.opts.exe,
            &common(&link.b_if),
            format!("xroce perf {test} server"),
        )?;
        // Start the client once the server listens (it says so on stderr with --json).
        let deadline = Instant::now() + READY_TIMEOUT;
        while !server.stderr_text().contains("Waiting for client") {
            if Instant::now() > deadline {
                bail!(
                    "xroce perf {test} server: not listening after {READY_TIMEOUT:?}{}",
                    server.said()
                );
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("xroce perf {test} server: {status}{}", server.said());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut client_args = common(&link.a_if);
        client_args.push(link.b_ip.to_string());
        let client = Proc::spawn(
            &link.a,
            &self.opts.exe,
            &client_args,
            format!("xroce perf {test} client"),
        )?;
        // Generous: the rows are sized to take a second or two.
        let out = client.finish(Duration::from_secs(180))?;
        let _ = server.finish(Duration::from_secs(10));
        Ok(out)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PerfResult {
    /// The headline figure: Gbit/s average or median latency.
    pub fn figure(&self) -> f64 {
        match *self {
            PerfResult::Bw { gbps, .. } => gbps,
            PerfResult::Lat { median, .. } => median,
        }
    }
}

/// What `xroce perf --json` reported for one size.
#[derive(Debug, Clone, PartialEq)]
pub enum PerfResult {
    /// A bandwidth test (Gbit/s with --report_gbits).
    Bw {
        /// Average.
        gbps: f64,
        /// Peak.
        peak_gbps: f64,
        /// Mpps.
        msg_rate_mpps: f64,
    },
    /// A latency test (µs).
    Lat {
        /// t_typical.
        median: f64,
        /// 99% percentile.
        p99: f64,
    },
}

/// Reads the first result of an `xroce perf --json` document.
pub fn parse_perf(doc: &str) -> anyhow::Result<PerfResult> {
    let v: serde_json::Value = serde_json::from_str(doc)?;
    let r = v["results"]
        .get(0)
        .ok_or_else(|| anyhow!("no results in {doc}"))?;
    let num = |k: &str| r[k].as_f64().ok_or_else(|| anyhow!("no {k:?} in {r}"));
    if r.get("median").is_some() {
        Ok(PerfResult::Lat {
            median: num("median")?,
            p99: num("p99")?,
        })
    } else {
        if r["unit"] != "GigabitsPerSec" {
            bail!("expected Gb/s (--report_gbits), got {}", r["unit"]);
        }
        Ok(PerfResult::Bw {
            gbps: num("average")?,
            peak_gbps: num("peak")?,
            msg_rate_mpps: num("msg_rate_mpps")?,
        })
    }
}

/// Each thread's message rate in an `xroce perf --json` document's first result (an older
/// perf without `per_thread`: none).
pub fn parse_per_thread_mpps(doc: &str) -> anyhow::Result<Vec<f64>> {
    let v: serde_json::Value = serde_json::from_str(doc)?;
    let Some(threads) = v["results"][0]["per_thread"].as_array() else {
        return Ok(Vec::new());
    };
    threads
        .iter()
        .map(|t| {
            t["msg_rate_mpps"]
                .as_f64()
                .ok_or_else(|| anyhow!("no \"msg_rate_mpps\" in {t}"))
        })
        .collect()
}

/// /proc/loadavg's three averages (zeros where it cannot be read).
fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut avg = [0.0; 3];
    for (slot, v) in avg.iter_mut().zip(text.split_whitespace()) {
        *slot = v.parse().unwrap_or(0.0);
    }
    avg
}

fn read_machine(link_desc: String) -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    Machine {
        started_utc: utc_now(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_average: load_average(),
        load_average_end: [0.0; 3],
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        xdp_mode: None,
        link: link_desc,
    }
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC` (days to a civil date: the proleptic Gregorian rule).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Which way a test's data flows: read_bw's responses go from B (server) to A (client).
fn data_direction(test: &str) -> &'static str {
    if test.starts_with("read") {
        "B->A"
    } else {
        "A->B"
    }
}

fn stream_ref<'a>(
    sec: &'a Option<RawSection>,
    mtu: u32,
    payload: u64,
    dir: &str,
) -> Option<&'a StreamRow> {
    sec.as_ref()?
        .streams
        .iter()
        .find(|r| r.link_mtu == mtu && r.payload == payload && r.direction == dir)
}

fn ping_ref(sec: &Option<RawSection>, mtu: u32, size: u64, mode: Progress) -> Option<&PingRow> {
    sec.as_ref()?
        .pingpongs
        .iter()
        .find(|r| r.link_mtu == mtu && r.payload == size && r.mode == mode)
}

fn bw_ratio(
    sec: &Option<RawSection>,
    name: &str,
    mtu: u32,
    payload: u64,
    dir: &str,
    gbps: f64,
) -> Option<Ratio> {
    let r = stream_ref(sec, mtu, payload, dir)?;
    Ratio::new(
        format!("{name} stream {dir}, {payload} B per packet, MTU {mtu}: payload Gbit/s"),
        r.payload_gbps,
        gbps,
    )
}

fn lat_ratios(sec: &Option<RawSection>, name: &str, row: &XroceLatRow) -> Option<LatencyRatios> {
    let (mtu, size, mode) = (row.link_mtu, row.size, row.mode);
    let r = ping_ref(sec, mtu, size, mode)?;
    let full_rtt = row.measures == "round trip";
    let (what, m, p) = if full_rtt {
        ("round trip", r.rtt_median_us, r.rtt_p99_us)
    } else {
        ("half round trip", r.half_rtt_median_us, r.half_rtt_p99_us)
    };
    let reference = |stat: &str| {
        format!(
            "{name} ping-pong {size} B, MTU {mtu}, {}: {stat} {what} (us)",
            mode.name()
        )
    };
    Some(LatencyRatios {
        median: Ratio::new(reference("median"), m, row.median_us)?,
        p99: Ratio::new(reference("p99"), p, row.p99_us)?,
    })
}

/// Runs the bench. Progress lines go to `log` (stderr); the result is the report.
pub fn run(opts: &BenchOptions, log: &mut dyn Write) -> anyhow::Result<BenchReport> {
    opts.validate()?;
    let started = Instant::now();
    let plan = plan(opts);
    let pairs: Vec<String> = plan
        .links
        .iter()
        .map(|l| {
            format!(
                "MTU {} with {} queue{} per end",
                l.mtu,
                l.queues,
                if l.queues == 1 { "" } else { "s" }
            )
        })
        .collect();
    let mut machine = read_machine(format!(
        "veth pairs between two network namespaces, 198.18.0.1 (A) and 198.18.0.2 (B), one after the other: {}",
        pairs.join("; ")
    ));
    let raw_steps =
        |l: &LinkPlan| l.stream_payloads.len() * 2 + l.ping_sizes.len() * opts.modes.len();
    let steps: usize = plan
        .links
        .iter()
        .map(|l| {
            let mut n =
                l.bw.len() + l.lat.len() + l.scale.len() + l.threads.len() + 2 * l.library.len();
            if opts.runs(Section::Ceiling) {
                n += raw_steps(l);
            }
            if opts.runs(Section::Udp) {
                n += raw_steps(l);
            }
            n
        })
        .sum::<usize>()
        + plan.memory_qps.len();
    let mut runner = Runner {
        opts,
        log,
        failures: Vec::new(),
        xdp_mode: None,
        step: 0,
        steps,
    };
    let mut ceiling = opts.runs(Section::Ceiling).then(RawSection::default);
    let mut udp = opts.runs(Section::Udp).then(RawSection::default);
    let mut bw_raw: Vec<(u32, u32, BwCase, f64, f64, f64)> = Vec::new();
    let mut library_rows: Vec<LibraryRow> = Vec::new();
    let mut lat_raw: Vec<(u32, LatCase, f64, f64)> = Vec::new();
    let mut scale_raw: Vec<(BwCase, f64, f64)> = Vec::new();
    type ThreadsOutcome = Result<(f64, f64, Vec<f64>), String>;
    let mut threads_raw: Vec<(BwCase, ThreadsOutcome)> = Vec::new();
    let mut links = Vec::new();

    for lp in &plan.links {
        let link = VethLink::create(&LinkConfig {
            mtu: lp.mtu,
            ipv6: false,
            queues: lp.queues,
            ..LinkConfig::default()
        })
        .with_context(|| format!("creating the namespaces and the veth pair (MTU {})", lp.mtu))?;
        link.add_static_neighbours()
            .context("adding the neighbour entries")?;
        let mut used = Vec::new();
        for (section, xdp, name) in [(&mut ceiling, true, "ceiling"), (&mut udp, false, "udp")] {
            let Some(sec) = section.as_mut() else {
                continue;
            };
            for &payload in &lp.stream_payloads {
                for a_to_b in [true, false] {
                    let what = format!(
                        "{name} stream {payload} B {} MTU {}",
                        if a_to_b { "A->B" } else { "B->A" },
                        lp.mtu
                    );
                    runner.note(&what);
                    match runner.stream(&link, xdp, payload, a_to_b) {
                        Ok(r) => sec.streams.push(r),
                        Err(e) => runner.failed(&what, e),
                    }
                }
            }
            for &size in &lp.ping_sizes {
                for &mode in &opts.modes {
                    let what = format!("{name} ping-pong {size} B {} MTU {}", mode.name(), lp.mtu);
                    runner.note(&what);
                    match runner.pingpong(&link, xdp, size, mode) {
                        Ok(r) => sec.pingpongs.push(r),
                        Err(e) => runner.failed(&what, e),
                    }
                }
            }
            if !lp.stream_payloads.is_empty() {
                used.push(name.to_string());
            }
        }
        for case in &lp.bw {
            let what = format!(
                "xroce perf {} -s {} -q {} -n {} MTU {}",
                case.test, case.size, case.qps, case.iters, lp.mtu
            );
            runner.note(&what);
            match runner.perf(&link, case, None) {
                Ok(PerfResult::Bw {
                    gbps,
                    peak_gbps,
                    msg_rate_mpps,
                }) => bw_raw.push((
                    lp.mtu,
                    lp.path_mtu,
                    case.clone(),
                    gbps,
                    peak_gbps,
                    msg_rate_mpps,
                )),
                Ok(other) => runner.failed(&what, anyhow!("not a bandwidth result: {other:?}")),
                Err(e) => runner.failed(&what, e),
            }
        }
        for case in &lp.lat {
            let what = format!(
                "xroce perf {} -s {} -n {} --progress {} MTU {}",
                case.test,
                case.size,
                case.iters,
                case.mode.name(),
                lp.mtu
            );
            runner.note(&what);
            let one = BwCase {
                test: case.test,
                size: case.size,
                qps: 1,
                iters: case.iters,
                threads: 1,
                shards: opts.shards,
            };
            match runner.perf(&link, &one, Some(case.mode)) {
                Ok(PerfResult::Lat { median, p99 }) => {
                    lat_raw.push((lp.mtu, case.clone(), median, p99))
                }
                Ok(other) => runner.failed(&what, anyhow!("not a latency result: {other:?}")),
                Err(e) => runner.failed(&what, e),
            }
        }
        if !lp.bw.is_empty() || !lp.lat.is_empty() {
            used.push("xroce".into());
        }
        for case in &lp.scale {
            let what = format!(
                "scale: xroce perf write_bw -s {} -q {} -n {} MTU {}",
                case.size, case.qps, case.iters, lp.mtu
            );
            runner.note(&what);
            match runner.perf(&link, case, None) {
                Ok(PerfResult::Bw {
                    gbps,
                    msg_rate_mpps,
                    ..
                }) => scale_raw.push((case.clone(), gbps, msg_rate_mpps)),
                Ok(other) => runner.failed(&what, anyhow!("not a bandwidth result: {other:?}")),
                Err(e) => runner.failed(&what, e),
            }
        }
        if !lp.scale.is_empty() {
            used.push("scale".into());
        }
        for case in &lp.threads {
            let what = format!(
                "threads: xroce perf {} -s {} -q {} --threads {} --shards {} -n {} MTU {}, {} queues",
                case.test, case.size, case.qps, case.threads, case.shards, case.iters, lp.mtu, lp.queues
            );
            runner.note(&what);
            let run = runner.perf_doc(&link, case, None).and_then(|doc| {
                let per_thread = parse_per_thread_mpps(&doc)?;
                Ok((parse_perf(&doc)?, per_thread))
            });
            let outcome = match run {
                Ok((
                    PerfResult::Bw {
                        gbps,
                        msg_rate_mpps,
                        ..
                    },
                    per_thread,
                )) => Ok((gbps, msg_rate_mpps, per_thread)),
                Ok((other, _)) => {
                    let e = anyhow!("not a bandwidth result: {other:?}");
                    let text = format!("{e:#}");
                    runner.failed(&what, e);
                    Err(text)
                }
                Err(e) => {
                    let text = format!("{e:#}");
                    runner.failed(&what, e);
                    Err(text)
                }
            };
            threads_raw.push((case.clone(), outcome));
        }
        if !lp.threads.is_empty() {
            used.push("threads".into());
        }
        for case in &lp.library {
            let what = format!(
                "library: ib_{} -s {} -n {} through xroce run, MTU {}",
                case.test, case.size, case.iters, lp.mtu
            );
            runner.note(&what);
            let perftest = runner.perftest(&link, case);
            if let Err(e) = &perftest {
                runner.failed(&what, anyhow!("{e:#}"));
            }
            let what = format!(
                "library: xroce perf {} -s {} -n {} beside it",
                case.test, case.size, case.iters
            );
            runner.note(&what);
            let perf = runner.perf(&link, case, None);
            if let Err(e) = &perf {
                runner.failed(&what, anyhow!("{e:#}"));
            }
            if let (Ok(p), Ok(x)) = (perftest, perf) {
                library_rows.push(LibraryRow::new(case, p, x));
            }
        }
        if !lp.library.is_empty() {
            used.push("library".into());
        }
        links.push(LinkFacts {
            mtu: lp.mtu,
            path_mtu: lp.path_mtu,
            queues: lp.queues,
            used_for: used.join(", "),
        });
        drop(link);
    }

    let mut memory = Vec::new();
    for &qps in &plan.memory_qps {
        let what = format!("memory of {qps} connected QP pairs (two in-memory devices)");
        runner.note(&what);
        match measure_memory(opts, qps) {
            Ok(m) => memory.push(m),
            Err(e) => runner.failed(&what, e),
        }
    }
    machine.xdp_mode = runner.xdp_mode.clone();
    machine.load_average_end = load_average();

    let xroce = opts.runs(Section::Xroce).then(|| XroceSection {
        bw: bw_raw
            .iter()
            .map(|(mtu, pmtu, c, gbps, peak, mpps)| {
                let payload = c.size.min(u64::from(*pmtu));
                let dir = data_direction(c.test);
                XroceBwRow {
                    test: c.test,
                    link_mtu: *mtu,
                    path_mtu: *pmtu,
                    size: c.size,
                    qps: c.qps,
                    iters: c.iters,
                    gbps: *gbps,
                    peak_gbps: *peak,
                    msg_rate_mpps: *mpps,
                    vs_ceiling: bw_ratio(&ceiling, "ceiling", *mtu, payload, dir, *gbps),
                    vs_udp: bw_ratio(&udp, "udp", *mtu, payload, dir, *gbps),
                }
            })
            .collect(),
        lat: lat_raw
            .iter()
            .map(|(mtu, c, median, p99)| {
                let full = c.test.starts_with("read");
                let mut row = XroceLatRow {
                    test: c.test,
                    mode: c.mode,
                    link_mtu: *mtu,
                    size: c.size,
                    iters: c.iters,
                    measures: if full {
                        "round trip"
                    } else {
                        "half round trip"
                    },
                    median_us: *median,
                    p99_us: *p99,
                    vs_ceiling: None,
                    vs_udp: None,
                };
                row.vs_ceiling = lat_ratios(&ceiling, "ceiling", &row);
                row.vs_udp = lat_ratios(&udp, "udp", &row);
                row
            })
            .collect(),
    });
    let scale = opts.runs(Section::Scale).then(|| {
        let pmtu = u64::from(path_mtu(BASE_MTU));
        let rows = scale_raw
            .iter()
            .map(|(c, gbps, mpps)| {
                let one = scale_raw.iter().find(|(o, _, _)| o.qps == 1 && o.size == c.size);
                ScaleRow {
                    size: c.size,
                    qps: c.qps,
                    iters: c.iters,
                    gbps: *gbps,
                    msg_rate_mpps: *mpps,
                    vs_one_qp: one.and_then(|(_, g, _)| {
                        Ratio::new(format!("write_bw {} B with 1 QP: payload Gbit/s", c.size), *g, *gbps)
                    }),
                    vs_ceiling: bw_ratio(&ceiling, "ceiling", BASE_MTU, c.size.min(pmtu), "A->B", *gbps),
                }
            })
            .collect();
        ScaleSection {
            link_mtu: BASE_MTU,
            rows,
            memory,
            memory_method: format!(
                "VmRSS of a fresh process (xroce bench-child) with two in-memory devices, before and after creating N QPs on each (xroce perf write_bw's queue depths, CQ and buffer: -s {}), connecting them pairwise and writing each buffer once; the growth divided by 2N. The devices themselves (and the AF_XDP UMEM a real device has, per device not per QP) are left out. With few QPs the growth is within the allocator's granularity (4 KiB pages, heap slack): the 1024-QP row is the figure.",
                MEMORY_SIZE
            ),
        }
    });
    let threads = opts.runs(Section::Threads).then(|| {
        let rows = threads_raw
            .iter()
            .map(|(c, outcome)| {
                let one = threads_raw.iter().find_map(|(o, r)| {
                    (o.test == c.test && o.threads == 1 && o.shards == 1)
                        .then(|| r.as_ref().ok().map(|(_, mpps, _)| *mpps))
                        .flatten()
                });
                let (gbps, mpps, per_thread, error) = match outcome {
                    Ok((g, m, p)) => (Some(*g), Some(*m), p.clone(), None),
                    Err(e) => (None, None, Vec::new(), Some(e.clone())),
                };
                ThreadsRow {
                    test: c.test,
                    size: c.size,
                    qps: c.qps,
                    threads: c.threads,
                    shards: c.shards,
                    iters: c.iters,
                    msg_rate_mpps: mpps,
                    gbps,
                    per_thread_mpps: per_thread,
                    vs_one_thread: one.zip(mpps).and_then(|(o, m)| {
                        Ratio::new(
                            format!(
                                "{} {} B, {} QPs, 1 thread, 1 shard: Mmsg/s",
                                c.test, c.size, c.qps
                            ),
                            o,
                            m,
                        )
                    }),
                    error,
                }
            })
            .collect();
        ThreadsSection {
            link_mtu: BASE_MTU,
            queues: THREAD_QUEUES,
            rows,
        }
    });
    let mut notes = vec![
        "Throughput ratios are xroce / reference: above 1 is faster. Latency ratios are xroce time / reference time: below 1 is faster.".to_string(),
        "Each xroce bandwidth row is compared with the stream of the same payload per packet (the message size up to the path MTU) in the direction its data flows (read_bw: B->A).".to_string(),
        "Latency: send_lat and write_lat print half a round trip, as perftest and sockperf do, and are compared with half the ping-pong's round trip; read_lat prints a whole round trip and is compared with the whole.".to_string(),
        "Latency statistics (median, p99) are computed as perftest computes them (tools/src/perftest/stats.rs), for the ping-pongs too.".to_string(),
        format!("The 4 KiB rows ran on a second veth pair at MTU {} (path MTU {}): one 4 KiB message per packet.", opts.jumbo_mtu, path_mtu(opts.jumbo_mtu)),
    ];
    if machine.cores <= 2 {
        notes.push(format!("This machine has {} cores: with busy-poll a spinning client and a spinning server fill it, so the busy-poll rows compete with everything else running (the load average is above).", machine.cores));
    }
    if opts.runs(Section::Threads) {
        notes.push(format!(
            "Threads: both sides run {THREAD_QPS} QPs split over --threads T (client and server alike), each thread polling its own QPs; with T = 2 that is 2 client threads and 2 server threads spinning, which fill a {}-core machine by themselves{}.",
            machine.cores,
            if machine.cores <= 2 {
                ": here the 2-thread rows compete with each other and with the progress threads, so they cannot show what two threads gain on a larger machine"
            } else {
                ""
            }
        ));
    }
    if opts.runs(Section::Library) {
        notes.push("Library: each perftest row ran on xroce's libibverbs.so.1 through `xroce run` right after `xroce perf`'s same test, size and count on the same veth pair; the ratio is perftest / xroce perf (for send_lat, above 1 is slower). Both use the library's and perf's default progress mode (wakeup).".into());
    }
    if opts.shards > 1 {
        notes.push(format!("--shards {}: the xroce and scale rows ran with {} engine shards on veth pairs with as many queues (the ceiling and UDP rows too).", opts.shards, opts.shards));
    }
    if opts.modes.contains(&Progress::BusyPoll) && !opts.perf_has_progress {
        notes.push("xroce perf has no --progress option in this build: the xroce latency rows ran in its default mode (wakeup) only.".into());
    }
    if machine.build == "debug" {
        notes.push(
            "A debug build: its figures mean little; measure with cargo build --release.".into(),
        );
    }
    let sections = Section::ALL.into_iter().filter(|s| opts.runs(*s)).collect();
    let mut report = BenchReport {
        machine,
        quick: opts.quick,
        sections,
        progress: opts.modes.clone(),
        links,
        ceiling,
        udp,
        xroce,
        scale,
        threads,
        library: opts
            .runs(Section::Library)
            .then_some(LibrarySection { rows: library_rows }),
        targets: Vec::new(),
        notes,
        failures: runner.failures,
        seconds: started.elapsed().as_secs_f64(),
    };
    report.targets = targets::targets(&report);
    Ok(report)
}

/// The message size whose buffers the memory rows allocate (perf's smallest buffer, 2 x 4 KiB,
/// serves every size up to 4 KiB).
const MEMORY_SIZE: u64 = 4096;

fn measure_memory(opts: &BenchOptions, qps: usize) -> anyhow::Result<QpMemory> {
    let spec = ChildSpec {
        role: ChildRole::QpMemory,
        ifname: String::new(),
        local_ip: std::net::Ipv4Addr::UNSPECIFIED,
        peer_ip: std::net::Ipv4Addr::UNSPECIFIED,
        peer_mac: [0; 6],
        size: MEMORY_SIZE as usize,
        count: 0,
        busy: false,
        qps,
    };
    let args = vec!["bench-child".to_string(), serde_json::to_string(&spec)?];
    let p = Proc::spawn_here(&opts.exe, &args, format!("bench-child QpMemory {qps}"))?;
    p.expect_ready()?;
    let m: QpMemory = p.result(Duration::from_secs(120))?;
    Ok(m)
}

// ---------------------------------------------------------------------------------------
// The text tables.

fn ratio_text(r: &Option<Ratio>) -> String {
    r.as_ref()
        .map_or("-".into(), |r| format!("{:.2}x", r.ratio))
}

fn lat_ratio_text(r: &Option<LatencyRatios>) -> (String, String) {
    match r {
        Some(r) => (
            format!("{:.2}x", r.median.ratio),
            format!("{:.2}x", r.p99.ratio),
        ),
        None => ("-".into(), "-".into()),
    }
}

fn raw_tables(s: &mut String, title: &str, sec: &RawSection) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\n== {title} ==");
    if !sec.streams.is_empty() {
        let _ = writeln!(
            s,
            "one-way stream (Mpkt/s and Gb/s at the receiver, first to last packet; sent/s at the sender):"
        );
        let _ = writeln!(
            s,
            "  {:>5} {:>4} {:>7} {:>6} {:>9} {:>9} {:>7} {:>9} {:>8} {:>9} {:>9}",
            "MTU",
            "dir",
            "payload",
            "frame",
            "sent",
            "received",
            "loss",
            "sent M/s",
            "Mpkt/s",
            "wire Gb/s",
            "data Gb/s"
        );
        for r in &sec.streams {
            let _ = writeln!(
                s,
                "  {:>5} {:>4} {:>7} {:>6} {:>9} {:>9} {:>6.2}% {:>9.3} {:>8.3} {:>9.2} {:>9.2}",
                r.link_mtu,
                r.direction,
                r.payload,
                r.frame_bytes,
                r.sent,
                r.received,
                r.loss_percent,
                r.sender_packets_per_sec / 1e6,
                r.packets_per_sec / 1e6,
                r.wire_gbps,
                r.payload_gbps
            );
        }
    }
    if !sec.pingpongs.is_empty() {
        let _ = writeln!(
            s,
            "ping-pong (us; half = half a round trip, as sockperf and ib_send_lat print):"
        );
        let _ = writeln!(
            s,
            "  {:>5} {:<9} {:>7} {:>7} {:>5} {:>10} {:>9} {:>11} {:>10}",
            "MTU",
            "mode",
            "payload",
            "trips",
            "lost",
            "RTT median",
            "RTT p99",
            "half median",
            "half p99"
        );
        for r in &sec.pingpongs {
            let _ = writeln!(
                s,
                "  {:>5} {:<9} {:>7} {:>7} {:>5} {:>10.2} {:>9.2} {:>11.2} {:>10.2}",
                r.link_mtu,
                r.mode.name(),
                r.payload,
                r.round_trips,
                r.lost,
                r.rtt_median_us,
                r.rtt_p99_us,
                r.half_rtt_median_us,
                r.half_rtt_p99_us
            );
        }
    }
}

/// The report as readable tables, one per section.
pub fn render_text(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(
        s,
        "xroce bench{}: the raw AF_XDP ceiling, kernel UDP and xroce, side by side",
        if r.quick { " --quick" } else { "" }
    );
    let _ = writeln!(s, "started {}, took {:.0} s", m.started_utc, r.seconds);
    let _ = writeln!(
        s,
        "machine: {} cores ({}), kernel {}, {} build",
        m.cores, m.cpu, m.kernel, m.build
    );
    let _ = writeln!(
        s,
        "load average at start: {:.2} {:.2} {:.2} (at the end: {:.2} {:.2} {:.2}; other work on the machine competes with every row)",
        m.load_average[0],
        m.load_average[1],
        m.load_average[2],
        m.load_average_end[0],
        m.load_average_end[1],
        m.load_average_end[2]
    );
    let _ = writeln!(s, "link: {}", m.link);
    let _ = writeln!(
        s,
        "AF_XDP mode: {}",
        m.xdp_mode
            .as_deref()
            .unwrap_or("not measured (no ceiling section); the tools default to copy mode")
    );
    for l in &r.links {
        let _ = writeln!(
            s,
            "  MTU {} (path MTU {}, {} queue{} per end): {}",
            l.mtu,
            l.path_mtu,
            l.queues,
            if l.queues == 1 { "" } else { "s" },
            l.used_for
        );
    }
    if let Some(c) = &r.ceiling {
        raw_tables(
            &mut s,
            "1. Ceiling: raw AF_XDP RoCE WRITE_ONLY frames through XdpDriver, no engine",
            c,
        );
    }
    if let Some(u) = &r.udp {
        raw_tables(
            &mut s,
            "2. Kernel UDP (std::net::UdpSocket, default socket buffers)",
            u,
        );
    }
    if let Some(x) = &r.xroce {
        let _ = writeln!(s, "\n== 3. xroce perf (server in B, client in A) ==");
        if !x.bw.is_empty() {
            let _ = writeln!(
                s,
                "bandwidth (payload; ratios against the stream of the same payload per packet):"
            );
            let _ = writeln!(
                s,
                "  {:<8} {:>5} {:>8} {:>4} {:>7} {:>8} {:>8} {:>10} {:>8}",
                "test", "MTU", "size", "QPs", "iters", "Gb/s", "Mmsg/s", "vs ceiling", "vs UDP"
            );
            for b in &x.bw {
                let _ = writeln!(
                    s,
                    "  {:<8} {:>5} {:>8} {:>4} {:>7} {:>8.3} {:>8.3} {:>10} {:>8}",
                    b.test,
                    b.link_mtu,
                    b.size,
                    b.qps,
                    b.iters,
                    b.gbps,
                    b.msg_rate_mpps,
                    ratio_text(&b.vs_ceiling),
                    ratio_text(&b.vs_udp)
                );
            }
        }
        if !x.lat.is_empty() {
            let _ = writeln!(s, "latency (us; send/write_lat half a round trip, read_lat a whole one; ratios are time / reference time):");
            let _ = writeln!(
                s,
                "  {:<9} {:<9} {:>5} {:>5} {:>8} {:>8} {:>11} {:>11} {:>10} {:>10}",
                "test",
                "mode",
                "MTU",
                "size",
                "median",
                "p99",
                "med/ceiling",
                "p99/ceiling",
                "med/UDP",
                "p99/UDP"
            );
            for l in &x.lat {
                let (cm, cp) = lat_ratio_text(&l.vs_ceiling);
                let (um, up) = lat_ratio_text(&l.vs_udp);
                let _ = writeln!(
                    s,
                    "  {:<9} {:<9} {:>5} {:>5} {:>8.2} {:>8.2} {:>11} {:>11} {:>10} {:>10}",
                    l.test,
                    l.mode.name(),
                    l.link_mtu,
                    l.size,
                    l.median_us,
                    l.p99_us,
                    cm,
                    cp,
                    um,
                    up
                );
            }
        }
    }
    if let Some(sc) = &r.scale {
        let _ = writeln!(
            s,
            "\n== 4. Scale: write_bw with N QPs, MTU {} ==",
            sc.link_mtu
        );
        if !sc.rows.is_empty() {
            let _ = writeln!(
                s,
                "  {:>6} {:>5} {:>8} {:>8} {:>8} {:>8} {:>10}",
                "size", "QPs", "iters/QP", "Gb/s", "Mmsg/s", "vs 1 QP", "vs ceiling"
            );
            for row in &sc.rows {
                let _ = writeln!(
                    s,
                    "  {:>6} {:>5} {:>8} {:>8.3} {:>8.3} {:>8} {:>10}",
                    row.size,
                    row.qps,
                    row.iters,
                    row.gbps,
                    row.msg_rate_mpps,
                    ratio_text(&row.vs_one_qp),
                    ratio_text(&row.vs_ceiling)
                );
            }
        }
        if !sc.memory.is_empty() {
            let _ = writeln!(s, "memory per QP:");
            let _ = writeln!(
                s,
                "  {:>5} {:>14} {:>13} {:>12} {:>12}",
                "QPs", "VmRSS before", "VmRSS after", "per QP", "of it buffer"
            );
            for mrow in &sc.memory {
                let _ = writeln!(
                    s,
                    "  {:>5} {:>10} KiB {:>9} KiB {:>8.1} KiB {:>8.1} KiB",
                    mrow.qps,
                    mrow.rss_before_kib,
                    mrow.rss_after_kib,
                    mrow.bytes_per_qp / 1024.0,
                    mrow.buffer_bytes as f64 / 1024.0
                );
            }
            let _ = writeln!(s, "  how: {}", sc.memory_method);
        }
    }
    if let Some(t) = &r.threads {
        let _ = writeln!(
            s,
            "\n== 5. Threads: perf --threads and --shards, MTU {}, {} queues per veth end ==",
            t.link_mtu, t.queues
        );
        let _ = writeln!(
            s,
            "  {:<8} {:>5} {:>4} {:>7} {:>6} {:>8} {:>8} {:>11}  per thread Mmsg/s",
            "test", "size", "QPs", "threads", "shards", "iters/QP", "Mmsg/s", "vs 1 thread",
        );
        for row in &t.rows {
            let figures = match (&row.error, row.msg_rate_mpps) {
                (Some(e), _) => format!("{:>8} {:>11}  error: {e}", "-", "-"),
                (None, Some(m)) => format!(
                    "{m:>8.3} {:>11}  {}",
                    ratio_text(&row.vs_one_thread),
                    row.per_thread_mpps
                        .iter()
                        .map(|p| format!("{p:.3}"))
                        .collect::<Vec<_>>()
                        .join(" + ")
                ),
                (None, None) => format!("{:>8} {:>11}", "-", "-"),
            };
            let _ = writeln!(
                s,
                "  {:<8} {:>5} {:>4} {:>7} {:>6} {:>8} {figures}",
                row.test, row.size, row.qps, row.threads, row.shards, row.iters
            );
        }
    }
    if let Some(lib) = &r.library {
        let _ = writeln!(
            s,
            "\n== 6. perftest on xroce's libibverbs.so.1 (xroce run) beside xroce perf, MTU {BASE_MTU} =="
        );
        let _ = writeln!(
            s,
            "{:<10} {:>7} {:>8} {:>7} {:>10} {:>10} {:>7}  within 10%",
            "test", "size", "iters", "unit", "perftest", "xroce perf", "ratio"
        );
        for row in &lib.rows {
            let _ = writeln!(
                s,
                "{:<10} {:>7} {:>8} {:>7} {:>10.3} {:>10.3} {:>7.2}  {}",
                row.test,
                row.size,
                row.iters,
                row.unit,
                row.perftest,
                row.xroce_perf,
                row.ratio,
                if row.within_10_percent { "yes" } else { "no" }
            );
        }
    }
    if r.xroce.is_some() || r.scale.is_some() {
        s.push_str(&targets::render(r));
    }
    let _ = writeln!(s, "\nnotes:");
    for n in &r.notes {
        let _ = writeln!(s, "- {n}");
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "\nFAILED ({}):", r.failures.len());
        for f in &r.failures {
            let _ = writeln!(s, "- {f}");
        }
    }
    s
}

#[cfg(test)]
mod tests {

    #[test]
    fn perftest_rows_are_read() {
        let bw = "---\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      2000             2.68               0.83   \t\t   0.001591\n---\n";
        assert_eq!(
            parse_perftest(bw, false).unwrap(),
            PerfResult::Bw {
                gbps: 0.83,
                peak_gbps: 2.68,
                msg_rate_mpps: 0.001591
            }
        );
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       200          8.22           1303.43      9.31     \t       14.87       \t45.48  \t\t634.90  \t\t1303.43\n";
        assert_eq!(
            parse_perftest(lat, true).unwrap(),
            PerfResult::Lat {
                median: 9.31,
                p99: 634.90
            }
        );
        assert!(parse_perftest("Couldn't connect", false).is_err());
        assert!(parse_perftest(" #bytes x\n 64 100\n", false).is_err());
    }

    #[test]
    fn library_rows_say_whether_within_ten_percent() {
        let case = library_cases(&BenchOptions {
            sections: vec![Section::Library],
            ..BenchOptions::new("xroce".into())
        })[0]
            .clone();
        let bw = |g| PerfResult::Bw {
            gbps: g,
            peak_gbps: g,
            msg_rate_mpps: 0.0,
        };
        assert!(LibraryRow::new(&case, bw(0.95), bw(1.0)).within_10_percent);
        assert!(!LibraryRow::new(&case, bw(0.8), bw(1.0)).within_10_percent);
        assert_eq!(LibraryRow::new(&case, bw(0.5), bw(1.0)).ratio, 0.5);
        assert!(library_cases(&BenchOptions::new("xroce".into())).is_empty());
    }

    use super::*;

    fn opts() -> BenchOptions {
        BenchOptions::new(PathBuf::from("xroce"))
    }

    #[test]
    fn quick_plan_covers_every_section_with_few_runs() {
        let mut o = opts();
        o.quick = true;
        let p = plan(&o);
        assert_eq!(p.links.len(), 3);
        assert_eq!(p.links[0].mtu, 1500);
        assert_eq!(p.links[0].queues, 1);
        assert_eq!(p.links[0].path_mtu, 1024);
        assert_eq!(p.links[1].mtu, 9000);
        assert_eq!(p.links[1].path_mtu, 4096);
        assert_eq!(p.links[1].stream_payloads, vec![4096]);
        let runs: usize = p
            .links
            .iter()
            .map(|l| l.bw.len() + l.lat.len() + l.scale.len() + l.threads.len())
            .sum();
        assert!(runs <= 36, "{runs} perf runs in --quick");
        // The threads rows: their own pair, with a queue per shard of the largest run.
        let t = &p.links[2];
        assert_eq!((t.mtu, t.queues), (1500, THREAD_QUEUES));
        assert!(t.bw.is_empty() && t.lat.is_empty() && t.stream_payloads.is_empty());
        for test in THREAD_TESTS {
            for (threads, shards) in THREAD_RUNS {
                let c = t
                    .threads
                    .iter()
                    .find(|c| c.test == test && c.threads == threads && c.shards == shards)
                    .unwrap_or_else(|| panic!("no {test} --threads {threads} --shards {shards}"));
                assert_eq!((c.size, c.qps), (THREAD_SIZE, THREAD_QPS));
                assert_eq!(c.qps % c.threads, 0);
            }
        }
        assert!(p.links[0].scale.iter().any(|c| c.qps == 1024));
        assert_eq!(p.memory_qps, SCALE_QPS.to_vec());
        for test in BW_TESTS {
            assert!(p.links[0].bw.iter().any(|c| c.test == test));
        }
        for mode in [Progress::Wakeup, Progress::BusyPoll] {
            for test in LAT_TESTS {
                for l in &p.links[..2] {
                    assert!(
                        l.lat.iter().any(|c| c.test == test && c.mode == mode),
                        "{test} {mode:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn full_plan_sweeps_every_size_with_one_and_many_qps() {
        let p = plan(&opts());
        let base = &p.links[0];
        for test in BW_TESTS {
            for size in FULL_BW_SIZES {
                for qps in BW_QPS {
                    assert!(base
                        .bw
                        .iter()
                        .any(|c| c.test == test && c.size == size && c.qps == qps));
                }
            }
        }
        // Every payload per packet a bandwidth row needs has its stream row.
        assert_eq!(base.stream_payloads, vec![64, 256, 1024]);
        for c in base.bw.iter().chain(&base.scale) {
            assert!(c.iters >= crate::perftest::run::MIN_ITERS);
        }
    }

    #[test]
    fn without_perf_progress_busy_poll_is_left_to_the_raw_rows() {
        let mut o = opts();
        o.perf_has_progress = false;
        let p = plan(&o);
        assert!(p
            .links
            .iter()
            .all(|l| l.lat.iter().all(|c| c.mode == Progress::Wakeup)));
        o.modes = vec![Progress::BusyPoll];
        o.modes_explicit = true;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("--progress busy-poll"), "{e}");
    }

    #[test]
    fn bad_options_name_the_option_and_the_range() {
        let mut o = opts();
        o.jumbo_mtu = 1500;
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("--mtu 1500: must be between 4176 and 9000"),
            "{e}"
        );
        let mut o = opts();
        o.lat_iters = Some(0);
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("-n/--iters 0: must be between 100 and"),
            "{e}"
        );
        let mut o = opts();
        o.messages = Some(0);
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--messages 0:"));
        let mut o = opts();
        o.sections.clear();
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--sections"));
    }

    #[test]
    fn threads_only_makes_one_multi_queue_pair() {
        let mut o = opts();
        o.sections = vec![Section::Threads];
        let p = plan(&o);
        assert_eq!(p.links.len(), 1);
        assert_eq!(p.links[0].queues, THREAD_QUEUES);
        assert_eq!(
            p.links[0].threads.len(),
            THREAD_TESTS.len() * THREAD_RUNS.len()
        );
        assert!(p.memory_qps.is_empty());
        // --shards is the other sections' (and their pairs' queues), not the threads rows'.
        let mut o = opts();
        o.shards = 4;
        let p = plan(&o);
        assert!(p.links[0]
            .bw
            .iter()
            .all(|c| c.shards == 4 && c.threads == 1));
        assert_eq!(p.links[0].queues, 4);
        let t = p.links.iter().find(|l| !l.threads.is_empty()).unwrap();
        assert!(t.threads.iter().any(|c| c.shards == 1));
        let mut o = opts();
        o.shards = 0;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.starts_with("--shards 0: must be between 1 and 64"), "{e}");
    }

    #[test]
    fn per_thread_rates_are_read() {
        let doc = r#"{"results":[{"size":64,"iters":20,"peak":0,"average":0.1,"msg_rate_mpps":0.4,"unit":"GigabitsPerSec","per_thread":[{"thread":0,"qps":1,"size":64,"iters":10,"peak":0,"average":0.05,"msg_rate_mpps":0.25,"unit":"GigabitsPerSec"},{"thread":1,"qps":1,"size":64,"iters":10,"peak":0,"average":0.05,"msg_rate_mpps":0.2,"unit":"GigabitsPerSec"}]}]}"#;
        assert_eq!(parse_per_thread_mpps(doc).unwrap(), vec![0.25, 0.2]);
        assert!(parse_per_thread_mpps(r#"{"results":[{"size":64}]}"#)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn threads_rows_render_figures_or_their_error() {
        let row = |threads, shards, mpps: Option<f64>, error: Option<&str>| ThreadsRow {
            test: "write_bw",
            size: 64,
            qps: 2,
            threads,
            shards,
            iters: 100,
            msg_rate_mpps: mpps,
            gbps: mpps.map(|m| m * 0.512),
            per_thread_mpps: if threads == 2 && mpps.is_some() {
                vec![0.3, 0.2]
            } else {
                Vec::new()
            },
            vs_one_thread: mpps.and_then(|m| Ratio::new("one".into(), 0.4, m)),
            error: error.map(str::to_string),
        };
        let report = BenchReport {
            machine: read_machine("test".into()),
            quick: true,
            sections: vec![Section::Threads],
            progress: vec![],
            links: vec![],
            ceiling: None,
            udp: None,
            xroce: None,
            scale: None,
            threads: Some(ThreadsSection {
                link_mtu: 1500,
                queues: 2,
                rows: vec![
                    row(1, 1, Some(0.4), None),
                    row(2, 1, Some(0.5), None),
                    row(
                        2,
                        2,
                        None,
                        Some("xroce perf write_bw client: exit status: 1"),
                    ),
                ],
            }),
            library: Some(LibrarySection {
                rows: vec![LibraryRow {
                    test: "write_bw",
                    size: 64,
                    iters: 1000,
                    unit: "Gbit/s",
                    perftest: 0.2,
                    xroce_perf: 0.25,
                    ratio: 0.8,
                    within_10_percent: false,
                }],
            }),
            targets: vec![],
            notes: vec![],
            failures: vec![],
            seconds: 1.0,
        };
        let text = render_text(&report);
        assert!(
            text.contains("== 6. perftest on xroce's libibverbs.so.1"),
            "{text}"
        );
        assert!(text.contains("   0.80  no"), "{text}");
        assert!(text.contains("== 5. Threads"), "{text}");
        assert!(text.contains("1.25x  0.300 + 0.200"), "{text}");
        assert!(
            text.contains("error: xroce perf write_bw client: exit status: 1"),
            "{text}"
        );
    }

    #[test]
    fn messages_shrink_with_size_within_bounds() {
        let o = opts();
        assert_eq!(o.messages_for(64), 200_000);
        assert_eq!(o.messages_for(4096), 100_000);
        assert_eq!(o.messages_for(1 << 20), 390);
        let mut q = opts();
        q.messages = Some(100);
        assert_eq!(q.messages_for(1 << 20), 100);
    }

    #[test]
    fn perf_json_is_read_for_both_kinds() {
        let bw = r#"{"test":"write_bw","results":[{"size":64,"iters":10,"peak":0.3,"average":0.25,"msg_rate_mpps":0.49,"unit":"GigabitsPerSec"}]}"#;
        assert_eq!(
            parse_perf(bw).unwrap(),
            PerfResult::Bw {
                gbps: 0.25,
                peak_gbps: 0.3,
                msg_rate_mpps: 0.49
            }
        );
        let lat = r#"{"results":[{"size":64,"iters":10,"samples":8,"min":1.0,"max":9.0,"median":2.0,"average":2.5,"stdev":0.5,"p99":8.0,"p99_9":9.0}]}"#;
        assert_eq!(
            parse_perf(lat).unwrap(),
            PerfResult::Lat {
                median: 2.0,
                p99: 8.0
            }
        );
        let mb = bw.replace("GigabitsPerSec", "MegabytesPerSec");
        assert!(parse_perf(&mb).is_err());
        assert!(parse_perf(r#"{"results":[]}"#).is_err());
    }

    #[test]
    fn targets_are_read_off_the_rows_and_judged() {
        let bw = |test, qps, mpps: f64, vs_ceiling: f64, vs_udp: f64| XroceBwRow {
            test,
            link_mtu: BASE_MTU,
            path_mtu: 1024,
            size: 64,
            qps,
            iters: 1000,
            gbps: mpps * 0.512,
            peak_gbps: 0.0,
            msg_rate_mpps: mpps,
            vs_ceiling: Ratio::new("ceiling".into(), 1.0, vs_ceiling),
            vs_udp: Ratio::new("udp".into(), 1.0, vs_udp),
        };
        let lat = |test, median: f64, p99: f64, vs_ceiling: f64| XroceLatRow {
            test,
            mode: Progress::BusyPoll,
            link_mtu: BASE_MTU,
            size: 64,
            iters: 1000,
            measures: "half round trip",
            median_us: median,
            p99_us: p99,
            vs_ceiling: Some(LatencyRatios {
                median: Ratio::new("c".into(), 1.0, vs_ceiling).unwrap(),
                p99: Ratio::new("c".into(), 1.0, vs_ceiling).unwrap(),
            }),
            vs_udp: None,
        };
        let mut report = BenchReport {
            machine: read_machine("test".into()),
            quick: false,
            sections: vec![Section::Xroce],
            progress: vec![Progress::BusyPoll],
            links: vec![],
            ceiling: None,
            udp: None,
            xroce: Some(XroceSection {
                bw: vec![
                    bw("write_bw", 1, 0.6, 0.8, 1.3),
                    bw("send_bw", 1, 0.5, 0.7, 1.0),
                    bw("send_bw", 16, 0.4, 0.5, 0.8),
                ],
                lat: vec![
                    lat("send_lat", 10.0, 25.0, 2.6),
                    lat("write_lat", 4.0, 6.0, 1.2),
                ],
            }),
            scale: None,
            threads: None,
            library: None,
            targets: vec![],
            notes: vec![],
            failures: vec![],
            seconds: 1.0,
        };
        report.targets = targets::targets(&report);
        let by_name = |name: &str| {
            report
                .targets
                .iter()
                .find(|t| t.name.starts_with(name))
                .unwrap_or_else(|| panic!("no target {name}"))
                .clone()
        };
        let write_bw = by_name("write_bw 64 B, 1 QP / raw");
        assert_eq!(
            (write_bw.met(), write_bw.goal_met()),
            (Some(true), Some(false))
        );
        assert_eq!(by_name("send_bw 64 B, 1 QP / raw").met(), Some(false));
        assert_eq!(by_name("write_bw 64 B, 1 QP / kernel").met(), Some(true));
        let send_lat = by_name("send_lat 64 B busy-poll median / raw");
        assert_eq!(send_lat.met(), Some(false));
        assert_eq!(by_name("send_lat 64 B busy-poll p99").ratio, Some(2.5));
        assert_eq!(by_name("write_lat 64 B busy-poll p99").met(), Some(true));
        let write_lat = by_name("write_lat 64 B busy-poll median / raw");
        assert_eq!(
            (write_lat.met(), write_lat.goal_met()),
            (Some(true), Some(true))
        );
        // Not measured: no UDP section, no scale section.
        assert_eq!(
            by_name("send_lat 64 B busy-poll median / kernel").met(),
            None
        );
        assert_eq!(by_name("write_bw 64 B, 1,024 QPs").ratio, None);
        let qps16 = by_name("send_bw 64 B, 16 QPs");
        assert!((qps16.ratio.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(qps16.met(), Some(false));
        let text = render_text(&report);
        assert!(text.contains("== Targets"), "{text}");
        assert!(text.contains("not run"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("write_bw 64 B, 1 QP / raw AF_XDP stream"))
            .unwrap();
        assert!(
            row.contains("0.80") && row.contains(">=0.75") && row.contains("yes"),
            "{row}"
        );
        assert!(row.trim_end().ends_with("NO"), "{row}");
    }

    #[test]
    fn utc_dates_follow_the_calendar() {
        let s = utc_now();
        assert!(s.ends_with(" UTC") && s.len() == 23, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
