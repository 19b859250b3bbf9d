//! `xroce sim`'s run: random RDMA operations between two engines over the simulated faulty
//! link ([`xroce::sim::workload`]), every byte checked against a model, then the summary and
//! the verdict (a failure scenario passes only when it made operations fail).
use std::path::PathBuf;

use xroce::sim::workload::{self, WorkloadConfig};

/// Where the run's record goes besides the summary.
#[derive(Debug, Clone, Default)]
pub struct SimOutput {
    /// Every frame to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Every frame as a line on stdout.
    pub trace: bool,
    /// With `trace`: each frame explained.
    pub explain: bool,
    /// The summary as one JSON line instead of text.
    pub json: bool,
}

/// Runs the workload and prints its summary (text or JSON) on stdout; whether the run was
/// correct.
pub fn run(cfg: &WorkloadConfig, out: &SimOutput) -> anyhow::Result<bool> {
    let scenario_active = cfg.scenario.no_recv
        || cfg.scenario.wrong_rkey_at.is_some()
        || cfg.link.partition_after.is_some();
    let (pcap, trace, explain) = (&out.pcap, out.trace, out.explain);
    let summary = workload::run(cfg, |net| {
        if let Some(p) = &pcap {
            net.set_pcap(p)?;
        }
        if trace {
            net.set_trace(Box::new(std::io::stdout()));
            net.set_trace_explain(explain);
        }
        Ok(())
    })?;
    let (ok, verdict) = verdict(&summary, cfg, scenario_active);
    if out.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        let s = &summary;
        println!(
            "xroce sim: seed {}, {} QPs, MTU {}, loss {} reorder {} duplicate {} corrupt {}",
            s.seed,
            cfg.qps,
            cfg.mtu.bytes(),
            cfg.link.loss,
            cfg.link.reorder,
            cfg.link.duplicate,
            cfg.link.corrupt
        );
        println!(
            "  operations: {} posted, {} completed, {} failed",
            s.ops_posted, s.ops_completed, s.ops_failed
        );
        for (k, v) in &s.ops_by_kind {
            println!("    {k:<10} {v}");
        }
        println!("  verified:   {} bytes, {} data mismatches, {} order violations, {} unexplained statuses",
            s.bytes_verified, s.data_mismatches, s.order_violations, s.unexpected_statuses);
        println!("  link:       {} frames sent, {} lost, {} partitioned, {} duplicated, {} reordered, {} corrupted",
            s.link.frames_sent, s.link.lost, s.link.partitioned, s.link.duplicated, s.link.reordered, s.link.corrupted);
        println!("  transport:  {} retransmitted packets, {} timeouts, {} sequence NAKs, {} RNR NAKs, {} ICRC drops",
            s.retransmitted_packets,
            s.counters_a.local_ack_timeout_err,
            s.counters_a.rcvd_seq_err,
            s.counters_a.rcvd_rnr_err,
            s.counters_a.drops.bad_icrc + s.counters_b.drops.bad_icrc);
        for (k, v) in &s.statuses {
            println!("  status {k:<34} {v}");
        }
        println!("  virtual time: {} us", s.virtual_time_us);
        for p in &s.problems {
            println!("  PROBLEM: {p}");
        }
        println!("  result: {verdict}");
    }
    Ok(ok)
}

/// The scenario's flags, as `xroce sim` takes them.
fn scenario_flags(cfg: &WorkloadConfig) -> String {
    let mut flags = Vec::new();
    if cfg.scenario.no_recv {
        flags.push("--no-recv".to_string());
    }
    if let Some(k) = cfg.link.partition_after {
        flags.push(format!("--partition-after {k}"));
    }
    if let Some(n) = cfg.scenario.wrong_rkey_at {
        flags.push(format!("--wrong-rkey {n}"));
    }
    flags.join(" ")
}

/// Whether the run passed, and the result line. A failure scenario passes when operations
/// failed as it makes them fail (said so: "OK" alone read as if everything succeeded), and
/// fails when it never took effect (nothing failed, so nothing was tested).
fn verdict(s: &workload::Summary, cfg: &WorkloadConfig, scenario_active: bool) -> (bool, String) {
    if !s.ok(scenario_active) {
        return (false, "FAILED (see the problems above)".to_string());
    }
    if !scenario_active {
        return (
            true,
            format!("OK: all {} operations completed and verified", s.ops_posted),
        );
    }
    let flags = scenario_flags(cfg);
    if s.ops_failed == 0 {
        let msg = format!(
            "FAILED: the scenario {flags} never took effect: all {} operations succeeded, so it tested nothing; choose a point inside the run ({} operations, {} frames)",
            s.ops_posted, s.ops_posted, s.link.frames_sent
        );
        return (false, msg);
    }
    let verified = if s.ops_completed > 0 {
        format!("; the {} that completed were verified", s.ops_completed)
    } else {
        String::new()
    };
    let msg = format!(
        "EXPECTED FAILURE: {} of {} operations failed as {flags} makes them fail, each with a status the scenario explains{verified}",
        s.ops_failed, s.ops_posted
    );
    (true, msg)
}
