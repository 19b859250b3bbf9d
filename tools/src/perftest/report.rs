//! perftest's text layout (header block, address lines, result tables), so the output of
//! `xroce perf` reads like `ib_write_bw`'s, and the JSON form for machines.

use crate::perftest::oob::{PerftestDest, TestKind};
use crate::perftest::stats::{BwStats, BwUnit, LatencyStats};

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// What the header block shows (`ctx_print_test_info`).
#[derive(Debug, Clone)]
pub struct TestInfo {
    /// The test.
    pub kind: TestKind,
    /// Device (interface) name.
    pub device: String,
    /// QPs.
    pub num_qps: usize,
    /// "RC" or "UD".
    pub connection: &'static str,
    /// Client (shows TX depth) or server (shows RX depth for SEND).
    pub is_client: bool,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Receive queue depth (SEND tests).
    pub rx_depth: u32,
    /// Completion moderation (bw tests).
    pub cq_mod: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// `-x`, if given.
    pub gid_index: Option<u32>,
    /// Max inline data (SEND/WRITE) .
    pub inline_size: u32,
    /// Outstanding reads (READ/atomic).
    pub out_reads: u32,
    /// For atomics: "CMP_AND_SWAP" or "FETCH_AND_ADD".
    pub atomic_type: Option<&'static str>,
    /// `--use-srq`: "Using SRQ : ON".
    pub use_srq: bool,
    /// `-b`: both sides run the test towards each other.
    pub duplex: bool,
    /// `-R`: the QPs and the exchange through rdma_cm.
    pub rdma_cm: bool,
}

/// The block perftest prints before connecting.
pub fn header(info: &TestInfo) -> String {
    let mut s = String::new();
    s.push_str(RESULT_LINE);
    s.push('\n');
    let mut title = format!("                    {} ", info.kind.verb_name());
    if let Some(atomic) = info.atomic_type {
        title.push_str(atomic);
        title.push(' ');
    }
    if info.kind.is_bw() && info.duplex {
        title.push_str("Bidirectional ");
    }
    title.push_str(if info.kind.is_bw() { "BW " } else { "Latency " });
    title.push_str("Test\n");
    s.push_str(&title);
    s.push_str(&format!(
        " Dual-port       : OFF\t\tDevice         : {}\n",
        info.device
    ));
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : IB\n",
        info.num_qps
    ));
    s.push_str(&format!(
        " Connection type : {}\t\tUsing SRQ      : {}\n",
        info.connection,
        if info.use_srq { "ON" } else { "OFF" }
    ));
    s.push_str(" PCIe relax order: Unsupported\n");
    s.push_str(" ibv_wr* API     : OFF\n");
    // A bidirectional server sends too (perftest: `machine == CLIENT || duplex`).
    if info.is_client || info.duplex {
        s.push_str(&format!(" TX depth        : {}\n", info.tx_depth));
    }
    if info.kind.verb() == crate::perftest::oob::enums::VERB_SEND && !info.is_client {
        s.push_str(&format!(" RX depth        : {}\n", info.rx_depth));
    }
    if info.kind.is_bw() {
        s.push_str(&format!(" CQ Moderation   : {}\n", info.cq_mod));
    }
    s.push_str(&format!(" Mtu             : {}[B]\n", info.mtu));
    s.push_str(" Link type       : Ethernet\n");
    if let Some(gid) = info.gid_index {
        s.push_str(&format!(" GID index       : {gid}\n"));
    }
    if info.kind.is_read_like() {
        s.push_str(&format!(" Outstand reads  : {}\n", info.out_reads));
    } else {
        s.push_str(&format!(" Max inline data : {}[B]\n", info.inline_size));
    }
    // perftest's -R connects the QPs and exchanges through rdma_cm.
    if info.rdma_cm {
        s.push_str(" rdma_cm QPs\t : ON\n");
        s.push_str(" Data ex. method : rdma_cm\n");
    } else {
        s.push_str(" rdma_cm QPs\t : OFF\n");
        s.push_str(" Data ex. method : Ethernet\n");
    }
    s.push_str(RESULT_LINE);
    s.push('\n');
    s
}

/// C's `%#0Nx`: "0x" plus zero padding to `width` characters in all, except that 0
/// prints without the prefix.
fn c_alt_hex(value: u64, width: usize) -> String {
    if value == 0 {
        format!("{:0width$x}", 0, width = width)
    } else {
        format!("0x{:0w$x}", value, w = width.saturating_sub(2))
    }
}

/// `ctx_print_pingpong_data`: e.g.
/// ` local address: LID 0000 QPN 0x0013 PSN 0x9b3cec RKey 0x000413 VAddr 0x0056449935b000`
/// and, with a GID, ` GID: 00:00:...:255:255:198:18:00:12` (perftest prints the GID bytes
/// in decimal, `%02d`).
pub fn address_lines(dest: &PerftestDest, remote: bool, kind: TestKind) -> String {
    let mut s = format!(
        " {} address: LID {} QPN {} PSN {}",
        if remote { "remote" } else { "local" },
        c_alt_hex(u64::from(dest.lid), 4),
        c_alt_hex(u64::from(dest.qpn), 6),
        c_alt_hex(u64::from(dest.psn), 6)
    );
    if kind.is_read_like() {
        s.push_str(&format!(" OUT {}", c_alt_hex(u64::from(dest.out_reads), 4)));
    }
    if kind.verb() != crate::perftest::oob::enums::VERB_SEND {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(dest.rkey), 8),
            c_alt_hex(dest.vaddr, 16)
        ));
    }
    s.push('\n');
    if let Some(gid) = dest.gid {
        let bytes: Vec<String> = gid.iter().map(|b| format!("{b:02}")).collect();
        s.push_str(&format!(" GID: {}\n", bytes.join(":")));
    }
    s
}

/// Column header of the bandwidth table.
pub fn bw_table_header(unit: BwUnit) -> String {
    let u = match unit {
        BwUnit::MegabytesPerSec => "MB/sec",
        BwUnit::GigabitsPerSec => "Gb/sec",
    };
    format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]")
}

/// One row (`REPORT_FMT`, or `REPORT_FMT_EXT` with 6 decimals for tiny Gb/s values).
pub fn bw_row(stats: &BwStats) -> String {
    if stats.unit == BwUnit::GigabitsPerSec && stats.average < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            stats.size, stats.iters, stats.peak, stats.average, stats.msg_rate_mpps
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            stats.size, stats.iters, stats.peak, stats.average, stats.msg_rate_mpps
        )
    }
}

/// One thread's row under the aggregate row (`--threads` > 1): the same columns after a
/// label, so a script that reads perftest's rows by their leading size skips it.
pub fn thread_bw_row(t: &ThreadBw) -> String {
    let plural = if t.qps == 1 { "" } else { "s" };
    format!(
        " thread {} ({} QP{plural}):{}",
        t.thread,
        t.qps,
        bw_row(&t.stats)
    )
}

/// Every sample of a latency test, one per line, numbered from 1 (perftest's `-H` and `-U`
/// lists: a `#, usec` line, then `N, value` with the value as C's `%g` prints it).
pub fn samples(values_usec: &[f64]) -> String {
    let mut s = String::from("#, usec\n");
    for (i, v) in values_usec.iter().enumerate() {
        s.push_str(&format!("{}, {}\n", i + 1, c_general(*v)));
    }
    s
}

/// `v` as C's `printf("%g")` writes it: six significant digits, trailing zeros dropped,
/// exponent form below 1e-4 and from 1e6.
fn c_general(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let strip = |t: String| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t
        }
    };
    // The exponent after rounding to six significant digits.
    let rounded: f64 = format!("{v:.5e}").parse().unwrap_or(v);
    let exp = rounded.abs().log10().floor() as i32;
    if !(-4..6).contains(&exp) {
        let text = format!("{v:.5e}");
        let (mantissa, e) = text.split_once('e').unwrap_or((&text, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mantissa.to_string()), e.abs())
    } else {
        strip(format!("{:.*}", (5 - exp).max(0) as usize, v))
    }
}

/// Column header of the latency table (`RESULT_FMT_LAT`).
pub fn lat_table_header() -> &'static str {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
}

/// One row (`REPORT_FMT_LAT`).
pub fn lat_row(size: u64, iters: u64, s: &LatencyStats) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        size, iters, s.min, s.max, s.median, s.average, s.stdev, s.p99, s.p99_9
    )
}

/// One size's result for `--json`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum JsonResult {
    /// A bandwidth row: the aggregate of every thread.
    Bw {
        /// Over every thread and QP, the first post of any to the last completion of any.
        #[serde(flatten)]
        stats: BwStats,
        /// Each thread's own figures (`--threads`; one entry with one thread); empty for a
        /// row the peer reported.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        per_thread: Vec<ThreadBw>,
    },
    /// A bidirectional (`-b`) bandwidth row: the sum of both directions, as printed.
    BwDuplex {
        /// Size and iterations of this side; peak, average and message rate of both.
        #[serde(flatten)]
        stats: BwStats,
        /// What this side's own loop measured (the direction towards the peer).
        local: BwStats,
        /// What the peer reported for its direction.
        remote: BwStats,
        /// This side's threads (`--threads`), as for [`JsonResult::Bw`].
        #[serde(skip_serializing_if = "Vec::is_empty")]
        per_thread: Vec<ThreadBw>,
    },
    /// A latency row.
    Lat {
        /// Message size.
        size: u64,
        /// Iterations.
        iters: u64,
        /// The statistics, µs.
        #[serde(flatten)]
        stats: LatencyStats,
    },
}

/// What one thread of a bandwidth run measured over its own QPs, from its first post to
/// its last completion.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ThreadBw {
    /// Thread number (0-based; thread `t` owns QPs `t * qps .. (t + 1) * qps`).
    pub thread: usize,
    /// QPs it owned.
    pub qps: usize,
    /// Its figures.
    #[serde(flatten)]
    pub stats: BwStats,
}

/// The whole `--json` document.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JsonReport {
    /// Test name, e.g. "write_bw".
    pub test: TestKind,
    /// "client" or "server".
    pub role: &'static str,
    /// Device (interface).
    pub device: String,
    /// Connection type.
    pub connection: &'static str,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Peer's perftest version string, if exchanged.
    pub remote_version: Option<String>,
    /// One entry per message size.
    pub results: Vec<JsonResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_print_as_perftest_printf_g() {
        // printf("%g") of each, as perftest's -H/-U lines print them.
        for (v, c) in [
            (2.815, "2.815"),
            (12.34567891, "12.3457"),
            (5.0, "5"),
            (0.1, "0.1"),
            (999999.7, "1e+06"),
            (1234567.0, "1.23457e+06"),
            (0.00001234, "1.234e-05"),
            (0.0, "0"),
        ] {
            assert_eq!(c_general(v), c, "{v}");
        }
        assert_eq!(samples(&[3.5, 12.0]), "#, usec\n1, 3.5\n2, 12\n");
    }

    #[test]
    fn address_line_matches_perftest_printf() {
        let dest = PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 0x13,
            psn: 0x9b3cec,
            rkey: 0x413,
            vaddr: 0x564499_35b000,
            gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 198, 18, 0, 12]),
            srqn: 0,
        };
        assert_eq!(
            address_lines(&dest, false, TestKind::WriteBw),
            " local address: LID 0000 QPN 0x0013 PSN 0x9b3cec RKey 0x000413 VAddr 0x0056449935b000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:12\n"
        );
    }

    #[test]
    fn table_rows() {
        let s = BwStats {
            size: 65536,
            iters: 5000,
            peak: 1234.5678,
            average: 1200.0,
            msg_rate_mpps: 0.0192,
            unit: BwUnit::MegabytesPerSec,
        };
        assert_eq!(
            bw_row(&s),
            " 65536      5000             1234.57            1200.00\t\t   0.019200"
        );
        let l = LatencyStats {
            samples: 10,
            min: 1.0,
            max: 9.0,
            median: 2.0,
            average: 2.5,
            stdev: 0.5,
            p99: 8.0,
            p99_9: 9.0,
        };
        assert_eq!(
            lat_row(2, 1000, &l),
            " 2       1000          1.00           9.00         2.00     \t       2.50        \t0.50   \t\t8.00    \t\t9.00   "
        );
    }
}
