//! `xroce bench`: the raw AF_XDP ceiling, kernel UDP and xroce measured side by side on veth
//! pairs between two namespaces (needs root). The logic is `xroce_tools::bench`; this file
//! is the arguments, and `xroce bench-child`, the processes it starts in the namespaces.
use std::io::Write;

use anyhow::Context;

use xroce_tools::bench::{self, child, BenchOptions, Progress, Section};

/// `--sections` names.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectionArg {
    /// Raw AF_XDP frames through the driver, no engine: streams both ways, ping-pong.
    Ceiling,
    /// Kernel UDP sockets: streams both ways, ping-pong.
    Udp,
    /// xroce perf: write/send/read_bw 64 B..1 MiB (1 and 16 QPs), send/write/read_lat.
    Xroce,
    /// write_bw with 1, 16, 256, 1024 QPs, and the memory each QP costs.
    Scale,
    /// write_bw and send_bw 64 B with perf --threads 1 and 2, --shards 1 and 2, on a veth
    /// pair with 2 queues per end.
    Threads,
    /// perftest's ib_write_bw, ib_send_bw and ib_send_lat on xroce's libibverbs.so.1
    /// (through `xroce run`), each beside xroce perf's same test (not run by default: needs
    /// Debian's perftest).
    Library,
    /// The engine alone: two engines joined in memory on one core moving 64-byte SENDs, no
    /// link (the message rate of xroce's own transport).
    Engine,
}

/// `--progress` names.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressArg {
    /// Sleep until a packet arrives (poll(2), blocking recv, xroce's default).
    Wakeup,
    /// Spin on the socket (xroce perf --progress busy-poll).
    BusyPoll,
    /// Both, side by side.
    Both,
}

/// The raw AF_XDP ceiling, kernel UDP and xroce on one veth pair, side by side (needs root,
/// but for the engine section alone).
///
/// Creates two network namespaces joined by a veth pair (MTU 1500, a second pair at --mtu
/// for the 4 KiB rows, a third with 2 queues per end for the threads rows), runs every
/// measurement in processes inside them, removes them, and prints one table per section
/// with every xroce figure as a ratio to the ceiling and to kernel UDP (the threads rows:
/// to one thread).
///
/// Examples:
///   sudo xroce bench --quick                 a minute: every section, few sizes
///   sudo xroce bench --json > bench.json     the full run (~10 minutes), for machines
///   sudo xroce bench --sections ceiling,udp  only the references
///   sudo xroce bench --sections threads      perf --threads 1 and 2, --shards 1 and 2
///   sudo xroce bench --sections library      perftest on xroce's libibverbs.so.1 beside xroce perf
///   xroce bench --sections engine            the engine alone, in this process (no root needed)
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Few sizes and iterations: every section in well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Sections to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SectionArg::Ceiling, SectionArg::Udp, SectionArg::Xroce, SectionArg::Scale, SectionArg::Threads, SectionArg::Engine])]
    pub sections: Vec<SectionArg>,
    /// Progress mode of the latency rows (default: both).
    #[arg(long, value_enum)]
    pub progress: Option<ProgressArg>,
    /// Link MTU of the second veth pair, where the 4 KiB rows run (4176..9000).
    #[arg(long, default_value_t = bench::MAX_JUMBO_MTU)]
    pub mtu: u32,
    /// Round trips per latency row (default 20000, --quick 2000).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Most messages per bandwidth row; larger messages send fewer (default 200000,
    /// --quick 20000).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Print one JSON document on stdout (progress and tables go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Engine shards of the xroce and scale sections' devices (perf --shards; their veth
    /// pairs get as many queues). The threads section runs its own shard counts.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
}

/// One process of `xroce bench` inside a namespace (not for direct use).
#[derive(clap::Args, Debug)]
pub struct ChildArgs {
    /// What to do, as JSON (`xroce_tools::bench::child::ChildSpec`).
    pub spec: String,
}

/// Whether `xroce perf` takes `--progress` (the coordinator's option; absent in older builds).
fn perf_has_progress() -> bool {
    use clap::Args as _;
    super::perf::Args::augment_args(clap::Command::new("perf"))
        .get_arguments()
        .any(|a| a.get_long() == Some("progress"))
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locating the xroce binary")?;
    let mut opts = BenchOptions::new(exe);
    opts.quick = args.quick;
    opts.sections = Section::ALL
        .into_iter()
        .filter(|s| {
            args.sections.contains(&match s {
                Section::Ceiling => SectionArg::Ceiling,
                Section::Udp => SectionArg::Udp,
                Section::Xroce => SectionArg::Xroce,
                Section::Scale => SectionArg::Scale,
                Section::Threads => SectionArg::Threads,
                Section::Library => SectionArg::Library,
                Section::Engine => SectionArg::Engine,
            })
        })
        .collect();
    if let Some(p) = args.progress {
        opts.modes_explicit = true;
        opts.modes = match p {
            ProgressArg::Wakeup => vec![Progress::Wakeup],
            ProgressArg::BusyPoll => vec![Progress::BusyPoll],
            ProgressArg::Both => vec![Progress::Wakeup, Progress::BusyPoll],
        };
    }
    opts.jumbo_mtu = args.mtu;
    opts.lat_iters = args.iters;
    opts.messages = args.messages;
    opts.perf_has_progress = perf_has_progress();
    opts.shards = args.shards;
    opts.validate()?;
    // The engine section alone runs in this process, with no namespace or link.
    let needs_root = opts.sections.iter().any(|s| *s != Section::Engine);
    if needs_root && !xroce::netns::is_privileged() {
        anyhow::bail!("xroce bench needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): it creates network namespaces and a veth pair and attaches XDP programs; run it with sudo");
    }
    #[cfg(not(feature = "xdp"))]
    if opts.sections.contains(&Section::Ceiling)
        || opts.sections.contains(&Section::Xroce)
        || opts.sections.contains(&Section::Scale)
        || opts.sections.contains(&Section::Threads)
    {
        return Err(anyhow::Error::from(xroce::driver::DriverError::XdpNotBuilt)
            .context("xroce bench: the ceiling, xroce, scale and threads sections need AF_XDP"));
    }
    let report = bench::run(&opts, &mut std::io::stderr())?;
    let text = bench::render_text(&report);
    if args.json {
        eprint!("{text}");
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{text}");
    }
    std::io::stdout().flush()?;
    Ok(if report.failures.is_empty() { 0 } else { 1 })
}

/// Runs one child process (`xroce bench-child '<spec>'`).
pub fn run_child(args: ChildArgs) -> anyhow::Result<i32> {
    let spec: child::ChildSpec =
        serde_json::from_str(&args.spec).context("bench-child: reading its JSON spec")?;
    child::run(&spec, &mut std::io::stdout().lock())?;
    Ok(0)
}
