//! The text tables of a report.

use super::*;

pub(super) fn ratio_text(r: &Option<Ratio>) -> String {
    r.as_ref()
        .map_or("-".into(), |r| format!("{:.2}x", r.ratio))
}

pub(super) fn lat_ratio_text(r: &Option<LatencyRatios>) -> (String, String) {
    match r {
        Some(r) => (
            format!("{:.2}x", r.median.ratio),
            format!("{:.2}x", r.p99.ratio),
        ),
        None => ("-".into(), "-".into()),
    }
}

pub(super) fn raw_tables(s: &mut String, title: &str, sec: &RawSection) {
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
