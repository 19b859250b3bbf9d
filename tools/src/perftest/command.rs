//! `xroce perf`'s run once its arguments are checked: open the endpoints, make the exchange
//! (over TCP, or the RDMA CM with `-R`), run the script and print perftest's report (or the
//! JSON document).
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use xroce::engine::QpType;
use xroce::verbs::ProgressMode;

use crate::endpoint::verbs::{self as verbs_endpoint, DriverChoice, EndpointSpec};
use crate::perftest::cm as perftest_cm;
use crate::perftest::oob::{
    self as perftest_oob, enums, PerftestComm, PerftestDest, Role, TestKind,
};
use crate::perftest::report::{JsonReport, TestInfo};
use crate::perftest::run::{PerfOptions, PerfRunner};
use crate::perftest::stats;
use crate::setup;

/// What one `xroce perf` side does: the test's options (checked and settled) and where it
/// runs.
#[derive(Debug, Clone)]
pub struct PerfCommand {
    /// The test and its options, depths settled.
    pub opts: PerfOptions,
    /// Interface name or xroce device name (`-d`); the only one when absent.
    pub device: Option<String>,
    /// GID index (`-x`).
    pub gid_index: Option<u32>,
    /// Path MTU (`-m`); the interface's when absent.
    pub mtu: Option<u32>,
    /// The server to connect to; a server itself when absent.
    pub host: Option<String>,
    /// TCP port of the exchange or the RDMA CM.
    pub port: u16,
    /// Inline bytes (`-I`), 0 for none.
    pub inline_size: u32,
    /// Outstanding READs and atomics (`-o`); the device's maximum when absent.
    pub outs: Option<u32>,
    /// The driver under the device.
    pub driver: DriverChoice,
    /// Write every frame to this pcap file.
    pub pcap: Option<PathBuf>,
    /// How the background progress thread waits.
    pub progress: ProgressMode,
    /// Engine shards of the device.
    pub shards: u32,
    /// The JSON document on stdout, the tables on stderr.
    pub json: bool,
    /// The perftest version announced.
    pub perftest_version: String,
    /// Skip the version exchange (`--dont_xchg_versions`).
    pub dont_xchg_versions: bool,
}

/// perftest's spelling of the connection type.
fn connection_name(opts: &PerfOptions) -> &'static str {
    if opts.ud {
        "UD"
    } else if opts.uc {
        "UC"
    } else {
        "RC"
    }
}

/// Runs one side to the end.
pub fn run_perf(cmd: PerfCommand) -> anyhow::Result<()> {
    let mut opts = cmd.opts.clone();
    let kind = opts.kind;
    let inline_size = cmd.inline_size;
    let dev = setup::pick_device(cmd.device.as_deref())?;
    let gid = setup::pick_gid(&dev, cmd.gid_index, "-x")?;
    let mtu = setup::pick_mtu(&dev, cmd.mtu)?;
    let mtu_enum = perftest_oob::mtu_enum(mtu).unwrap_or(3);
    let sizes = opts.sizes(mtu);
    if opts.ud && sizes.iter().any(|&s| s > u64::from(mtu)) {
        anyhow::bail!(
            "Max message size in UD cannot be greater than MTU ({mtu}); use -s {mtu} or less"
        );
    }
    let spec = EndpointSpec {
        qp_type: if opts.ud {
            QpType::Ud
        } else if opts.uc {
            QpType::Uc
        } else {
            QpType::Rc
        },
        buf_len: 2 * opts.half_len(),
        max_send_wr: opts.tx_depth.max(2),
        max_recv_wr: opts.rx_depth.max(2),
        driver: cmd.driver,
        events: opts.events,
        pcap: cmd.pcap.clone(),
        progress: cmd.progress,
        shards: cmd.shards,
    };
    let role = if cmd.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let srq_depth = opts.srq_depth(role)?;
    let mut eps = verbs_endpoint::open_with_srq(&dev, &gid, &spec, opts.num_qps, srq_depth)?;
    for ep in &mut eps {
        ep.set_inline(inline_size)?;
    }
    let info0 = eps[0].local();
    opts.out_reads = cmd.outs.unwrap_or(info0.max_rd_atomic).max(1);

    let dests: Vec<PerftestDest> = eps
        .iter()
        .map(|ep| {
            let info = ep.local();
            opts.dest(&info, setup::random_psn())
        })
        .collect();
    let local = opts.local_side(mtu_enum, info0.max_rd_atomic as i32, dests.clone());

    // With --json the human tables go to stderr and stdout carries only the document.
    let mut text: Box<dyn Write> = if cmd.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    if kind.is_bw() && !opts.measures_peak_as(role) {
        writeln!(text, "{}", stats::NO_PEAK_WARNING)?;
    }
    let info = TestInfo {
        kind,
        device: dev.name.clone(),
        num_qps: opts.num_qps,
        connection: connection_name(&opts),
        is_client: role == Role::Client,
        tx_depth: opts.tx_depth,
        rx_depth: opts.rx_depth,
        cq_mod: opts.cq_mod,
        mtu,
        gid_index: Some(gid.index),
        inline_size,
        out_reads: opts.out_reads,
        atomic_type: (kind.verb() == enums::VERB_ATOMIC).then_some(if opts.fetch_add {
            "FETCH_AND_ADD"
        } else {
            "CMP_AND_SWAP"
        }),
        use_srq: opts.use_srq,
        duplex: opts.duplex,
        rdma_cm: opts.rdma_cm,
    };
    let steps = opts.script(role, &sizes);
    let wait_banner = |text: &mut dyn Write| -> anyhow::Result<()> {
        writeln!(text, "\n************************************")?;
        writeln!(text, "* Waiting for client to connect... *")?;
        writeln!(text, "************************************")?;
        text.flush()?;
        Ok(())
    };
    let ep_refs: Vec<&mut (dyn crate::endpoint::ToolEndpoint + 'static)> =
        eps.iter_mut().map(|e| e.as_mut()).collect();
    let (outcome, mut runner) = if opts.rdma_cm {
        // -R: the exchange and the QPs over rdma_cm on the device the QPs live on.
        let (_, device) = ep_refs[0]
            .verbs_qp()
            .ok_or_else(|| anyhow::anyhow!("-R needs endpoints over xroce::verbs"))?;
        let cm = perftest_cm::cm_for(&device)?;
        let stream = match &cmd.host {
            Some(host) => {
                perftest_cm::CmStream::connect(&cm, host, cmd.port, Duration::from_secs(10))?
            }
            None => perftest_cm::CmStream::accept(&cm, cmd.port, || wait_banner(text.as_mut()))?,
        };
        let out_reads = kind.is_read_like().then_some(opts.out_reads.min(255) as u8);
        let qps = perftest_cm::CmQps::new(&cm, role, cmd.host.as_deref(), cmd.port, out_reads)?
            .with_ack_timeout(opts.qp_timeout);
        let mut comm = PerftestComm::new(
            stream,
            role,
            &cmd.perftest_version,
            cmd.dont_xchg_versions,
            true,
        )
        .with_rdma_cm(gid.index);
        let mut runner = PerfRunner::new(ep_refs, opts.clone(), role, dests, text.as_mut())
            .with_test_info(info)
            .with_rdma_cm(qps);
        let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        runner.cm_disconnect()?;
        comm.into_inner().shutdown();
        (outcome, runner)
    } else {
        let stream = match &cmd.host {
            Some(host) => setup::connect(host, cmd.port, Duration::from_secs(10))?,
            None => {
                wait_banner(text.as_mut())?;
                setup::accept_one(cmd.port)?
            }
        };
        let mut comm = PerftestComm::new(
            stream,
            role,
            &cmd.perftest_version,
            cmd.dont_xchg_versions,
            true,
        );
        let mut runner =
            PerfRunner::new(ep_refs, opts.clone(), role, dests, text.as_mut()).with_test_info(info);
        let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        (outcome, runner)
    };
    if role == Role::Server && kind.is_bw() && kind != TestKind::SendBw && !opts.duplex {
        if let Some(rep) = outcome.remote_report {
            runner.print_remote_bw(&rep)?;
        }
    }
    runner.finish()?;
    let results = std::mem::take(&mut runner.results);
    drop(runner);
    if cmd.json {
        let doc = JsonReport {
            test: kind,
            role: if role == Role::Client {
                "client"
            } else {
                "server"
            },
            device: dev.name.clone(),
            connection: connection_name(&opts),
            mtu: perftest_oob::mtu_bytes(outcome.mtu_enum).unwrap_or(mtu),
            remote_version: outcome.remote_version,
            results,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}
