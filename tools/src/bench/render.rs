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

/// A column of a text table: its title, width and side, stated once for the header and
/// every row.
#[derive(Clone, Copy)]
pub(super) struct Col {
    title: &'static str,
    width: usize,
    left: bool,
    /// Spaces before it (one, or two before a trailing free-text column).
    gap: usize,
}

/// A right-aligned column.
pub(super) const fn right(title: &'static str, width: usize) -> Col {
    Col {
        title,
        width,
        left: false,
        gap: 1,
    }
}

/// A left-aligned column.
pub(super) const fn left(title: &'static str, width: usize) -> Col {
    Col {
        title,
        width,
        left: true,
        gap: 1,
    }
}

impl Col {
    /// Set off by two spaces.
    pub(super) const fn apart(self) -> Col {
        Col { gap: 2, ..self }
    }
}

/// Writes a header and `rows` under `cols`, each line starting with `indent`; a row's
/// cells are already formatted (precision, units), a missing cell is blank.
pub(super) fn table(
    s: &mut String,
    indent: &str,
    cols: &[Col],
    rows: impl IntoIterator<Item = Vec<String>>,
) {
    let mut line = |cells: &mut dyn Iterator<Item = String>| {
        s.push_str(indent);
        for (i, (col, cell)) in cols.iter().zip(cells).enumerate() {
            if i > 0 {
                s.extend(std::iter::repeat_n(' ', col.gap));
            }
            let w = col.width;
            s.push_str(&if col.left {
                format!("{cell:<w$}")
            } else {
                format!("{cell:>w$}")
            });
        }
        let trimmed = s.trim_end_matches(' ').len();
        s.truncate(trimmed);
        s.push('\n');
    };
    line(&mut cols.iter().map(|c| c.title.to_string()));
    for row in rows {
        line(&mut row.into_iter());
    }
}

/// `x` with `places` decimals.
pub(super) fn fixed(x: f64, places: usize) -> String {
    format!("{x:.places$}")
}

pub(super) fn raw_tables(s: &mut String, title: &str, sec: &RawSection) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\n== {title} ==");
    if !sec.streams.is_empty() {
        let _ = writeln!(
            s,
            "one-way stream (Mpkt/s and Gb/s at the receiver, first to last packet; sent/s at the sender):"
        );
        let cols = [
            right("MTU", 5),
            right("dir", 4),
            right("payload", 7),
            right("frame", 6),
            right("sent", 9),
            right("received", 9),
            right("loss", 7),
            right("sent M/s", 9),
            right("Mpkt/s", 8),
            right("wire Gb/s", 9),
            right("data Gb/s", 9),
        ];
        let rows = sec.streams.iter().map(|r| {
            vec![
                r.link_mtu.to_string(),
                r.direction.to_string(),
                r.payload.to_string(),
                r.frame_bytes.to_string(),
                r.sent.to_string(),
                r.received.to_string(),
                format!("{:.2}%", r.loss_percent),
                fixed(r.sender_packets_per_sec / 1e6, 3),
                fixed(r.packets_per_sec / 1e6, 3),
                fixed(r.wire_gbps, 2),
                fixed(r.payload_gbps, 2),
            ]
        });
        table(s, "  ", &cols, rows);
    }
    if !sec.pingpongs.is_empty() {
        let _ = writeln!(
            s,
            "ping-pong (us; half = half a round trip, as sockperf and ib_send_lat print):"
        );
        let cols = [
            right("MTU", 5),
            left("mode", 9),
            right("payload", 7),
            right("trips", 7),
            right("lost", 5),
            right("RTT median", 10),
            right("RTT p99", 9),
            right("half median", 11),
            right("half p99", 10),
        ];
        let rows = sec.pingpongs.iter().map(|r| {
            vec![
                r.link_mtu.to_string(),
                r.mode.name().to_string(),
                r.payload.to_string(),
                r.round_trips.to_string(),
                r.lost.to_string(),
                fixed(r.rtt_median_us, 2),
                fixed(r.rtt_p99_us, 2),
                fixed(r.half_rtt_median_us, 2),
                fixed(r.half_rtt_p99_us, 2),
            ]
        });
        table(s, "  ", &cols, rows);
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
    if let Some(h) = &m.hiccups {
        let _ = writeln!(s, "hiccups: {}", h.describe());
    }
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
            let cols = [
                left("test", 8),
                right("MTU", 5),
                right("size", 8),
                right("QPs", 4),
                right("iters", 7),
                right("Gb/s", 8),
                right("Mmsg/s", 8),
                right("vs ceiling", 10),
                right("vs UDP", 8),
            ];
            let rows = x.bw.iter().map(|b| {
                vec![
                    b.test.to_string(),
                    b.link_mtu.to_string(),
                    b.size.to_string(),
                    b.qps.to_string(),
                    b.iters.to_string(),
                    fixed(b.gbps, 3),
                    fixed(b.msg_rate_mpps, 3),
                    ratio_text(&b.vs_ceiling),
                    ratio_text(&b.vs_udp),
                ]
            });
            table(&mut s, "  ", &cols, rows);
        }
        if !x.lat.is_empty() {
            let _ = writeln!(s, "latency (us; send/write_lat half a round trip, read_lat a whole one; ratios are time / reference time):");
            let cols = [
                left("test", 11),
                left("mode", 9),
                right("MTU", 5),
                right("size", 5),
                right("median", 8),
                right("p99", 8),
                right("med/ceiling", 11),
                right("p99/ceiling", 11),
                right("med/UDP", 10),
                right("p99/UDP", 10),
            ];
            let rows = x.lat.iter().map(|row| {
                let (cm, cp) = lat_ratio_text(&row.vs_ceiling);
                let (um, up) = lat_ratio_text(&row.vs_udp);
                vec![
                    row.test.to_string(),
                    row.mode.name().to_string(),
                    row.link_mtu.to_string(),
                    row.size.to_string(),
                    fixed(row.median_us, 2),
                    fixed(row.p99_us, 2),
                    cm,
                    cp,
                    um,
                    up,
                ]
            });
            table(&mut s, "  ", &cols, rows);
        }
    }
    if let Some(sc) = &r.scale {
        let _ = writeln!(
            s,
            "\n== 4. Scale: write_bw with N QPs, MTU {} ==",
            sc.link_mtu
        );
        if !sc.rows.is_empty() {
            let cols = [
                right("size", 6),
                right("QPs", 5),
                right("iters/QP", 8),
                right("Gb/s", 8),
                right("Mmsg/s", 8),
                right("vs 1 QP", 8),
                right("vs ceiling", 10),
            ];
            let rows = sc.rows.iter().map(|row| {
                vec![
                    row.size.to_string(),
                    row.qps.to_string(),
                    row.iters.to_string(),
                    fixed(row.gbps, 3),
                    fixed(row.msg_rate_mpps, 3),
                    ratio_text(&row.vs_one_qp),
                    ratio_text(&row.vs_ceiling),
                ]
            });
            table(&mut s, "  ", &cols, rows);
        }
        if !sc.memory.is_empty() {
            let _ = writeln!(s, "memory per QP:");
            let cols = [
                right("QPs", 5),
                right("VmRSS before", 14),
                right("VmRSS after", 13),
                right("per QP", 12),
                right("of it buffer", 12),
            ];
            let rows = sc.memory.iter().map(|m| {
                vec![
                    m.qps.to_string(),
                    format!("{} KiB", m.rss_before_kib),
                    format!("{} KiB", m.rss_after_kib),
                    format!("{:.1} KiB", m.bytes_per_qp / 1024.0),
                    format!("{:.1} KiB", m.buffer_bytes as f64 / 1024.0),
                ]
            });
            table(&mut s, "  ", &cols, rows);
            let _ = writeln!(s, "  how: {}", sc.memory_method);
        }
    }
    if let Some(t) = &r.threads {
        let _ = writeln!(
            s,
            "\n== 5. Threads: perf --threads and --shards, MTU {}, {} queues per veth end ==",
            t.link_mtu, t.queues
        );
        let cols = [
            left("test", 8),
            right("size", 5),
            right("QPs", 4),
            right("threads", 7),
            right("shards", 6),
            right("iters/QP", 8),
            right("Mmsg/s", 8),
            right("vs 1 thread", 11),
            left("per thread Mmsg/s", 0).apart(),
        ];
        let rows = t.rows.iter().map(|row| {
            let (rate, ratio, per_thread) = match (&row.error, row.msg_rate_mpps) {
                (Some(e), _) => ("-".into(), "-".into(), format!("error: {e}")),
                (None, Some(m)) => (
                    fixed(m, 3),
                    ratio_text(&row.vs_one_thread),
                    row.per_thread_mpps
                        .iter()
                        .map(|p| fixed(*p, 3))
                        .collect::<Vec<_>>()
                        .join(" + "),
                ),
                (None, None) => ("-".into(), "-".into(), String::new()),
            };
            vec![
                row.test.to_string(),
                row.size.to_string(),
                row.qps.to_string(),
                row.threads.to_string(),
                row.shards.to_string(),
                row.iters.to_string(),
                rate,
                ratio,
                per_thread,
            ]
        });
        table(&mut s, "  ", &cols, rows);
    }
    if let Some(lib) = &r.library {
        let _ = writeln!(
            s,
            "\n== 6. perftest on xroce's libibverbs.so.1 (xroce run) beside xroce perf, MTU {BASE_MTU} =="
        );
        let cols = [
            left("test", 10),
            right("size", 7),
            right("iters", 8),
            right("unit", 7),
            right("perftest", 10),
            right("xroce perf", 10),
            right("ratio", 7),
            left("within 10%", 0).apart(),
        ];
        let rows = lib.rows.iter().map(|row| {
            vec![
                row.test.to_string(),
                row.size.to_string(),
                row.iters.to_string(),
                row.unit.to_string(),
                fixed(row.perftest, 3),
                fixed(row.xroce_perf, 3),
                fixed(row.ratio, 2),
                (if row.within_10_percent { "yes" } else { "no" }).to_string(),
            ]
        });
        table(&mut s, "", &cols, rows);
    }
    if let Some(e) = &r.engine {
        let _ = writeln!(
            s,
            "\n== 7. The engine alone: {} B SENDs between two engines in memory, one core, no link ==",
            e.size
        );
        let _ = writeln!(
            s,
            "  {:.3} M msg/s ({} messages in {:.2} s; both ends' work, one signaled in 16)",
            e.msg_rate_mpps, e.messages, e.seconds
        );
        if let Some(line) = super::engine::tenths_line(&e.tenths_mpps) {
            let _ = writeln!(s, "  {line}");
        }
    }
    if r.xroce.is_some() || r.scale.is_some() || r.engine.is_some() {
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
