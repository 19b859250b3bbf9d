//! What a bench run measures: its options, the cases of each section, the links they run on.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

use crate::options::in_range;
use xroce::engine::Mtu;

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
/// `send_lat` over UC (`perf send_lat -c UC`), beside the RC row in busy-poll mode at 64 B:
/// UC sends no ACK, so the two rows' difference is what the ACK costs a ping-pong's half.
pub const UC_SEND_LAT: &str = "send_lat_uc";
/// The size of the UC row.
pub const UC_SEND_LAT_SIZE: u64 = 64;
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
pub(super) const PERF_PORT: u16 = 18515;
/// perftest's port in the library section (its own default, kept apart from the perf rows').
pub(super) const PERFTEST_PORT: u16 = 18516;

/// How long a child may take to say READY (opening an AF_XDP socket, loading the program).
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The engine alone: two engines joined in memory on one core, 64-byte SENDs.
    Engine,
}

impl Section {
    /// Every section, in the order they print.
    pub const ALL: [Section; 7] = [
        Section::Ceiling,
        Section::Udp,
        Section::Xroce,
        Section::Scale,
        Section::Threads,
        Section::Library,
        Section::Engine,
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
            Section::Engine => "engine",
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
            bail!("--sections: name at least one of ceiling, udp, xroce, scale, threads, library, engine");
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

    pub(super) fn runs(&self, s: Section) -> bool {
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
pub(super) fn library_cases(opts: &BenchOptions) -> Vec<BwCase> {
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
            if mode == Progress::BusyPoll && size == UC_SEND_LAT_SIZE {
                v.push(LatCase {
                    test: UC_SEND_LAT,
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
