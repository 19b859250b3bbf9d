//! `xroce perf <test>`: perftest's `ib_send_bw` ... `ib_atomic_lat`, with perftest's
//! options, TCP exchange (byte-exact with perftest 6.06, Debian bookworm) and output.
use xroce::verbs::ProgressMode;
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::options;
use xroce_tools::perftest::command::{run_perf, PerfCommand};
use xroce_tools::perftest::oob::{self as perftest_oob, TestKind, BOOKWORM_VERSION};
use xroce_tools::perftest::run::{self as perf, PerfOptions};

const EXAMPLES: &str = "\
Examples:
  # RDMA WRITE bandwidth: server first, then the client
  xroce perf write_bw -d veth0 -x 1
  xroce perf write_bw -d veth1 -x 1 198.18.0.1
  # every size from 2 bytes to 8 MiB, Gb/s, JSON for scripts
  xroce perf write_bw -d veth1 -x 1 -a --report_gbits --json 198.18.0.1
  # READ latency with min/median/avg/max/p99/p99.9, against perftest on an rxe host:
  #   (on the rxe host) ib_read_lat -d rxe0 -x 1 -F
  xroce perf read_lat -d eth0 -x 1 -F 198.18.0.11
  # atomics: fetch-and-add or compare-and-swap
  xroce perf atomic_bw -A CMP_AND_SWAP -d eth0 -x 1 198.18.0.11
  # bidirectional WRITE bandwidth: -b on both sides, each prints the sum of both ways
  xroce perf write_bw -b -d veth1 -x 1 198.18.0.1
  # 8 QPs over 4 threads, each with its own engine shard (the interface needs 4 queues)
  xroce perf write_bw -d veth1 -x 1 -s 64 -q 8 --threads 4 --shards 4 198.18.0.1";

/// Connection type (`-c`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conn {
    /// Reliable connected.
    #[value(name = "RC")]
    Rc,
    /// Unreliable datagram (send tests only).
    #[value(name = "UD")]
    Ud,
    /// Unreliable connected (send and write tests).
    #[value(name = "UC")]
    Uc,
}

/// Atomic operation (`-A`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atomic {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add.
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

/// Arguments (perftest's names).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Which test.
    #[arg(value_parser = super::values::test())]
    pub test: TestKind,
    /// Server to connect to; without it, wait for a client.
    pub host: Option<String>,
    /// Network interface (the "IB device").
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// GID index (RoCE needs one; default: the first IPv4 GID).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// Message size (default 65536 for bw, 2 for lat, 8 for atomics).
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Iterations (default 5000 for write_bw, 1000 for the others, as perftest).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run every size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the largest the link carries).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// TCP port.
    #[arg(short = 'p', long = "port", default_value_t = perftest_oob::DEFAULT_PORT)]
    pub port: u16,
    /// Number of QPs (bw tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qp: usize,
    /// Split the QPs over this many threads (bw tests; 1..=64, -q a multiple of it): each
    /// owns its QPs, CQs and buffers. The peer need not use the same number. The table gets
    /// a row per thread under the total; --json a per_thread list.
    #[arg(long = "threads", default_value_t = 1)]
    pub threads: usize,
    /// Engine shards of the device (1..=64; with --threads T use --shards T and at least T
    /// receive queues on the interface, so no two threads share an engine lock).
    #[arg(long = "shards", default_value_t = 1)]
    pub shards: u32,
    /// Run for this many seconds instead of -n (write/read/atomic bw, read/atomic lat).
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Send queue depth (default 128 for bw, 1 for lat).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Send SENDs and WRITEs of up to SIZE bytes inline (send and write tests; at most the
    /// device's max_inline_data).
    #[arg(short = 'I', long = "inline_size", value_name = "SIZE")]
    pub inline_size: Option<u32>,
    /// Receive queue depth (send tests); with --use-srq the depth of the SRQ.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub rx_depth: u32,
    /// Take the receives of all QPs from one shared receive queue of -r WRs (send tests,
    /// receiving side; perftest's --use-srq).
    #[arg(long = "use-srq", alias = "use_srq")]
    pub use_srq: bool,
    /// Completion moderation: signal every n-th send (bw tests).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    pub cq_mod: u32,
    /// Accepted for perftest compatibility (xroce measures wall time, not CPU cycles).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Connection type.
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Conn::Rc)]
    pub connection: Conn,
    /// Atomic operation.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value_t = Atomic::FetchAndAdd)]
    pub atomic_type: Atomic,
    /// Outstanding READ/atomic requests (default: the device maximum).
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u32>,
    /// Report Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Latency tests: print every sample, sorted (the two largest dropped, as for the
    /// summary), before the summary row (perftest's -H).
    #[arg(short = 'H', long = "report-histogram")]
    pub report_histogram: bool,
    /// Latency tests: print every sample in the order measured, before the summary row
    /// (perftest's -U): where in the run the slow ones fell.
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// QP local ACK timeout: 4.096 us x 2^N (0 = none; default 14 = 67 ms), as perftest's -u.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Bidirectional: both sides run the test towards each other at once and each prints
    /// the sum of both directions (write_bw, read_bw, atomic_bw; give it on both sides).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Sleep on CQ events (completion channel) instead of busy polling; not for the WRITE
    /// tests (perftest refuses that too).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Skip the version, page-size and MTU exchange (only between xroce peers; perftest
    /// 6.06 itself refuses to run this way).
    #[arg(long = "dont_xchg_versions")]
    pub dont_xchg_versions: bool,
    /// Version to announce; "6.29" or later also exchanges the parameter block.
    #[arg(long = "perftest-version", default_value = BOOKWORM_VERSION)]
    pub perftest_version: String,
    /// Connect the QPs through rdma_cm, one id per QP, on -p's port (perftest's -R): the
    /// exchange then runs over an rdma_cm connection too, as perftest's does; no TCP.
    /// RC only; the server's address must be an IP address.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Print the results as JSON on stdout (the tables go to stderr).
    #[arg(long = "json")]
    pub json: bool,
    /// Frame driver.
    #[arg(long = "driver", value_parser = super::values::driver(), default_value_t = DriverChoice::Xdp)]
    pub driver: DriverChoice,
    /// Write every frame this endpoint sends and receives to FILE (pcap, Ethernet link
    /// type): over AF_XDP, tcpdump on the interface sees no RoCE frames.
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// How the device's background progress thread waits (a thread polling its CQ makes
    /// progress itself either way; docs/performance.md says when each is right).
    #[arg(long = "progress", value_parser = super::values::progress(), default_value_t = ProgressMode::Wakeup)]
    pub progress: ProgressMode,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let kind = args.test;
    let mut opts = PerfOptions::defaults(kind);
    if let Some(s) = args.size {
        opts.size = s;
    }
    if let Some(n) = args.iters {
        opts.iters = n;
    }
    opts.all_sizes = args.all;
    opts.duration = args.duration;
    opts.num_qps = args.qp;
    opts.threads = args.threads;
    if let Some(t) = args.tx_depth {
        opts.tx_depth = t;
    }
    opts.rx_depth = args.rx_depth;
    opts.cq_mod = args.cq_mod;
    opts.fetch_add = args.atomic_type == Atomic::FetchAndAdd;
    opts.ud = args.connection == Conn::Ud;
    opts.uc = args.connection == Conn::Uc;
    opts.report_gbits = args.report_gbits;
    if (args.report_histogram || args.report_unsorted) && kind.is_bw() {
        // perftest_parameters.c refuses -H and -U in bandwidth tests too.
        anyhow::bail!(
            "-H/--report-histogram and -U/--report-unsorted apply only to the latency tests; drop them"
        );
    }
    opts.report_histogram = args.report_histogram;
    opts.report_unsorted = args.report_unsorted;
    opts.events = args.events;
    opts.use_srq = args.use_srq;
    opts.duplex = args.bidirectional;
    opts.qp_timeout = args.qp_timeout;
    opts.rdma_cm = args.rdma_cm;
    if args.rdma_cm && args.connection != Conn::Rc {
        anyhow::bail!("-R/--rdma_cm: xroce connects only RC QPs through rdma_cm; drop -c or -R");
    }
    // The limits apply to what was typed (as perftest checks -r before it caps it at -n);
    // then the depths are settled as perftest settles them.
    opts.validate()?;
    opts.settle_depths();
    options::tcp_port("-p/--port", args.port)?;
    options::in_range(
        "--shards",
        args.shards,
        1,
        xroce::verbs::MAX_SHARDS,
        "engine shards of the device",
    )?;
    if let Some(o) = args.outs {
        if !kind.is_read_like() {
            // perftest_parameters.c refuses -o outside the READ and atomic tests too.
            anyhow::bail!("-o/--outs: outstanding reads apply only to read_bw, read_lat and the atomic tests; drop -o");
        }
        options::in_range(
            "-o/--outs",
            o,
            1,
            perf::MAX_OUT_READS,
            "the device's max_qp_rd_atom, as ibv_devinfo -v shows",
        )?;
    }
    let inline_size = args.inline_size.unwrap_or(0);
    if inline_size > 0 {
        if kind.is_read_like() {
            // perftest: inline is for SEND and WRITE only.
            anyhow::bail!(
                "-I/--inline_size: inline data applies only to the send and write tests; drop -I"
            );
        }
        options::in_range(
            "-I/--inline_size",
            inline_size,
            0,
            xroce::verbs::attr::limits::MAX_INLINE_DATA,
            "the device's max_inline_data, as xroce devinfo -v shows",
        )?;
    }
    if perftest_oob::version_number(&args.perftest_version) < perftest_oob::MIN_COMPATIBLE_VERSION {
        anyhow::bail!("--perftest-version must be 5.70 or newer (perftest refuses older peers)");
    }

    run_perf(PerfCommand {
        opts,
        device: args.ib_dev,
        gid_index: args.gid_index,
        mtu: args.mtu,
        host: args.host,
        port: args.port,
        inline_size,
        outs: args.outs,
        driver: args.driver,
        pcap: args.pcap,
        progress: args.progress,
        shards: args.shards,
        json: args.json,
        perftest_version: args.perftest_version,
        dont_xchg_versions: args.dont_xchg_versions,
    })?;
    Ok(0)
}
