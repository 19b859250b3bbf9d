//! `xroce sim`: run random RDMA operations between two engines over a simulated faulty
//! link, check every byte against a model, print a summary (or JSON), a trace or a pcap.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use xroce::engine::Mtu;
use xroce::sim::workload::{OpKind, Scenario, WorkloadConfig};
use xroce::sim::LinkConfig;
use xroce_tools::simulate::{self, SimOutput};

/// Arguments of `xroce sim`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of operations to run.
    #[arg(long, default_value_t = 1000)]
    ops: u64,
    /// Largest message size in bytes (sizes are random up to this).
    #[arg(long, default_value_t = 4096)]
    max_size: u32,
    /// Number of RC QP pairs.
    #[arg(long, default_value_t = 2)]
    qps: u32,
    /// Outstanding operations per QP.
    #[arg(long, default_value_t = 16)]
    depth: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Probability a frame is lost.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability a frame is delayed so later frames overtake it.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Probability a frame is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Probability a frame has a byte flipped (caught by the ICRC).
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// One-way link latency in microseconds.
    #[arg(long, default_value_t = 5.0)]
    latency_us: f64,
    /// Link rate in Gbit/s (0 = unlimited).
    #[arg(long, default_value_t = 25.0)]
    rate_gbps: f64,
    /// Seed of every random choice; the same seed gives the same output.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every frame on the link to this pcap file (virtual timestamps).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Print a packet-by-packet trace to stdout.
    #[arg(long)]
    trace: bool,
    /// With --trace: every frame's headers field by field under its line (as `dump --explain`).
    #[arg(long, requires = "trace")]
    explain: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// Only these operations (comma separated: send,send-imm,write,write-imm,read,cas,fadd).
    #[arg(long, value_delimiter = ',')]
    op: Vec<String>,
    /// Local ACK timeout exponent (4.096 us x 2^t).
    #[arg(long, default_value_t = 14)]
    timeout: u8,
    /// Transport retry count, 0-7 retries (7 is finite, as the spec has it; rxe retries forever).
    #[arg(long)]
    retry_cnt: Option<u8>,
    /// RNR retry count (7 = infinite).
    #[arg(long)]
    rnr_retry: Option<u8>,
    /// RNR NAK timer code the responder advertises (0..31; 1 = 10 us, 12 = 640 us).
    #[arg(long, default_value_t = 12)]
    min_rnr_timer: u8,
    /// max_rd_atomic and max_dest_rd_atomic.
    #[arg(long, default_value_t = 16)]
    max_rd_atomic: u8,
    /// Scenario: the peer never posts a receive WQE (RNR NAKs until rnr_retry runs out).
    #[arg(long)]
    no_recv: bool,
    /// Scenario: the peer posts its receive WQEs only after this many microseconds (RNR NAKs,
    /// then success).
    #[arg(long)]
    recv_delay_us: Option<u64>,
    /// Scenario: drop every frame after the first K (retry exhaustion).
    #[arg(long)]
    partition_after: Option<u64>,
    /// Scenario: operation N (or the next RDMA/atomic op after it) uses a wrong R_Key.
    #[arg(long)]
    wrong_rkey: Option<u64>,
}

/// Most operations one run takes (about a minute of CPU).
const MAX_OPS: u64 = 10_000_000;

fn parse_op(s: &str) -> anyhow::Result<OpKind> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "send" => OpKind::Send,
        "send-imm" | "send_imm" => OpKind::SendImm,
        "write" => OpKind::Write,
        "write-imm" | "write_imm" => OpKind::WriteImm,
        "read" => OpKind::Read,
        "cas" => OpKind::Cas,
        "fadd" => OpKind::Fadd,
        other => {
            bail!("unknown operation {other:?} (send, send-imm, write, write-imm, read, cas, fadd)")
        }
    })
}

fn probability(name: &str, p: f64) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&p) || p.is_nan() {
        bail!("--{name} {p}: a probability must be between 0 and 1");
    }
    Ok(p)
}

/// Build the workload configuration from the arguments (all checks here).
pub fn config(args: &Args) -> anyhow::Result<WorkloadConfig> {
    let Some(mtu) = Mtu::from_bytes(args.mtu) else {
        bail!("--mtu {}: must be 256, 512, 1024, 2048 or 4096", args.mtu);
    };
    if args.ops == 0 || args.ops > MAX_OPS {
        bail!(
            "--ops {}: must be 1..={MAX_OPS} (a run is one thread of virtual time; split longer ones by --seed)",
            args.ops
        );
    }
    if args.qps == 0 || args.qps > 1024 {
        bail!("--qps {}: must be 1..=1024", args.qps);
    }
    if args.depth == 0 || args.depth > 1024 {
        bail!("--depth {}: must be 1..=1024", args.depth);
    }
    if args.max_size == 0 || args.max_size > 16 << 20 {
        bail!("--max-size {}: must be 1..=16777216", args.max_size);
    }
    if args.timeout == 0 || args.timeout > 31 {
        bail!("--timeout {}: must be 1..=31", args.timeout);
    }
    if args.min_rnr_timer > 31 {
        bail!("--min-rnr-timer {}: must be 0..=31", args.min_rnr_timer);
    }
    if args.max_rd_atomic == 0 || args.max_rd_atomic > 128 {
        bail!("--max-rd-atomic {}: must be 1..=128", args.max_rd_atomic);
    }
    if !(0.0..1e9).contains(&args.latency_us) || args.rate_gbps.is_nan() || args.rate_gbps < 0.0 {
        bail!("--latency-us and --rate-gbps must be non-negative");
    }
    for (n, v) in [("retry-cnt", args.retry_cnt), ("rnr-retry", args.rnr_retry)] {
        if v.is_some_and(|v| v > 7) {
            bail!("--{n}: must be 0..=7");
        }
    }
    // Scenarios that must end in an error need a finite retry budget.
    let retry_cnt = args
        .retry_cnt
        .unwrap_or(if args.partition_after.is_some() { 3 } else { 7 });
    let rnr_retry = args.rnr_retry.unwrap_or(if args.no_recv { 2 } else { 7 });
    if args.no_recv && rnr_retry == 7 {
        bail!("--no-recv with --rnr-retry 7 would retry forever (7 = infinite)");
    }
    let op_mix = args
        .op
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| parse_op(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(WorkloadConfig {
        ops: args.ops,
        max_size: args.max_size,
        qps: args.qps,
        depth: args.depth,
        mtu,
        seed: args.seed,
        link: LinkConfig {
            latency: Duration::from_nanos((args.latency_us * 1000.0) as u64),
            rate_bps: (args.rate_gbps > 0.0).then_some((args.rate_gbps * 1e9) as u64),
            loss: probability("loss", args.loss)?,
            reorder: probability("reorder", args.reorder)?,
            duplicate: probability("duplicate", args.duplicate)?,
            corrupt: probability("corrupt", args.corrupt)?,
            partition_after: args.partition_after,
            ..LinkConfig::default()
        },
        timeout: args.timeout,
        retry_cnt,
        rnr_retry,
        min_rnr_timer: args.min_rnr_timer,
        max_rd_atomic: args.max_rd_atomic,
        op_mix,
        scenario: Scenario {
            no_recv: args.no_recv,
            recv_delay: args.recv_delay_us.map(Duration::from_micros),
            wrong_rkey_at: args.wrong_rkey,
        },
        time_limit: Duration::from_secs(3600),
    })
}

/// Run `xroce sim`. Exit status 0 if the run was correct, 1 otherwise.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let cfg = config(&args)?;
    let ok = simulate::run(
        &cfg,
        &SimOutput {
            pcap: args.pcap,
            trace: args.trace,
            explain: args.explain,
            json: args.json,
        },
    )?;
    Ok(if ok { 0 } else { 1 })
}
