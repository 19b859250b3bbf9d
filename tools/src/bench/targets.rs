//! The data path's targets, read off one bench run: each a ratio of two figures measured side
//! by side, the threshold it must reach, and the project's goal beyond it. docs/performance.md
//! says where each comes from and what stands between today and the goal.

use serde::Serialize;

use super::hiccups::Hiccups;
use super::render::{left, right, table};
use super::{BenchReport, Progress, XroceLatRow, BASE_MTU, UC_SEND_LAT};

/// Whether a target's ratio must reach its threshold from below or stay under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The ratio must be at least the threshold (throughput).
    AtLeast,
    /// The ratio must be at most the threshold (time).
    AtMost,
}

/// One target and what this run measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared with what.
    pub name: &'static str,
    /// The ratio measured, `None` when the run did not measure both figures. For a target
    /// that is a rate, not a ratio, the rate (see `unit`).
    pub ratio: Option<f64>,
    /// What `ratio` is counted in: "ratio", or the rate's unit ("M msg/s").
    pub unit: &'static str,
    /// At least or at most.
    pub bound: Bound,
    /// The threshold.
    pub threshold: f64,
    /// The project's goal beyond the threshold, where there is one.
    pub goal: Option<f64>,
}

impl Target {
    fn reaches(&self, limit: f64) -> Option<bool> {
        self.ratio.map(|r| match self.bound {
            Bound::AtLeast => r >= limit,
            Bound::AtMost => r <= limit,
        })
    }

    /// Whether the threshold is met (`None`: not measured).
    pub fn met(&self) -> Option<bool> {
        self.reaches(self.threshold)
    }

    /// Whether the goal is met (`None`: no goal, or not measured).
    pub fn goal_met(&self) -> Option<bool> {
        self.goal.and_then(|g| self.reaches(g))
    }
}

/// The run's 64-byte busy-poll latency row of `test` at the base MTU: the row the latency
/// targets, the ACK's share and the hiccups' verdict read.
fn busy_poll_64<'r>(r: &'r BenchReport, test: &str) -> Option<&'r XroceLatRow> {
    r.xroce.as_ref()?.lat.iter().find(|l| {
        l.test == test && l.size == 64 && l.mode == Progress::BusyPoll && l.link_mtu == BASE_MTU
    })
}

// The ACK's share compares the UC row with the 64-byte RC row of the same lookup.
const _: () = assert!(super::UC_SEND_LAT_SIZE == 64);

/// The targets of a run, in the order docs/performance.md gives them.
pub fn targets(r: &BenchReport) -> Vec<Target> {
    let bw = |test: &str, qps: usize| {
        r.xroce.as_ref().and_then(|x| {
            x.bw.iter()
                .find(|b| b.test == test && b.size == 64 && b.qps == qps && b.link_mtu == BASE_MTU)
        })
    };
    let target = |name, ratio: Option<f64>, bound, threshold, goal| Target {
        name,
        ratio: ratio.filter(|r| r.is_finite()),
        unit: "ratio",
        bound,
        threshold,
        goal,
    };
    let vs_ceiling = |test| bw(test, 1).and_then(|b| b.vs_ceiling.as_ref().map(|c| c.ratio));
    let qps16 = bw("send_bw", 16)
        .zip(bw("send_bw", 1))
        .map(|(many, one)| many.msg_rate_mpps / one.msg_rate_mpps);
    let qps1024 = r.scale.as_ref().and_then(|s| {
        s.rows
            .iter()
            .find(|row| row.size == 64 && row.qps == 1024)
            .and_then(|row| row.vs_one_qp.as_ref().map(|v| v.ratio))
    });
    let mut v = vec![
        target(
            "write_bw 64 B, 1 QP / raw AF_XDP stream",
            vs_ceiling("write_bw"),
            Bound::AtLeast,
            0.75,
            Some(0.85),
        ),
        target(
            "send_bw 64 B, 1 QP / raw AF_XDP stream",
            vs_ceiling("send_bw"),
            Bound::AtLeast,
            0.75,
            Some(0.85),
        ),
        target(
            "write_bw 64 B, 1 QP / kernel UDP stream",
            bw("write_bw", 1).and_then(|b| b.vs_udp.as_ref().map(|u| u.ratio)),
            Bound::AtLeast,
            1.25,
            None,
        ),
    ];
    for (test, vs_ceiling_name, vs_udp_name, tail_name) in [
        (
            "send_lat",
            "send_lat 64 B busy-poll median / raw AF_XDP half round trip",
            "send_lat 64 B busy-poll median / kernel UDP half round trip",
            "send_lat 64 B busy-poll p99 / its median",
        ),
        (
            "write_lat",
            "write_lat 64 B busy-poll median / raw AF_XDP half round trip",
            "write_lat 64 B busy-poll median / kernel UDP half round trip",
            "write_lat 64 B busy-poll p99 / its median",
        ),
    ] {
        let row = busy_poll_64(r, test);
        v.push(target(
            vs_ceiling_name,
            row.and_then(|l| l.vs_ceiling.as_ref().map(|c| c.median.ratio)),
            Bound::AtMost,
            2.0,
            Some(1.3),
        ));
        v.push(target(
            vs_udp_name,
            row.and_then(|l| l.vs_udp.as_ref().map(|u| u.median.ratio)),
            Bound::AtMost,
            1.5,
            None,
        ));
        v.push(target(
            tail_name,
            row.map(|l| l.p99_us / l.median_us),
            Bound::AtMost,
            2.0,
            None,
        ));
    }
    v.push(target(
        "send_bw 64 B, 16 QPs / 1 QP",
        qps16,
        Bound::AtLeast,
        0.9,
        None,
    ));
    v.push(target(
        "write_bw 64 B, 1,024 QPs / 1 QP",
        qps1024,
        Bound::AtLeast,
        0.8,
        None,
    ));
    v.push(Target {
        unit: "M msg/s",
        ..target(
            "engine alone, 64 B SENDs: M msg/s (a rate, not a ratio)",
            r.engine.as_ref().map(|e| e.msg_rate_mpps),
            Bound::AtLeast,
            4.0,
            Some(5.0),
        )
    });
    v
}

/// What the ACK costs a busy-poll ping-pong's half round trip: the RC `send_lat` row against
/// the UC one (the same ping-pong with no ACK), with the UC row's ratio to the raw ping-pong
/// (xroce's own work, the ACK aside). `None` when the run lacks either row.
pub fn ack_share(r: &BenchReport) -> Option<String> {
    let (rc, uc) = (busy_poll_64(r, "send_lat")?, busy_poll_64(r, UC_SEND_LAT)?);
    if rc.median_us < uc.median_us {
        return Some(format!(
            "send_lat 64 B busy-poll median: RC {:.2} us, UC {:.2} us: UC slower than RC in this run (noise), no split",
            rc.median_us, uc.median_us
        ));
    }
    let uc_vs_raw = uc.vs_ceiling.as_ref().map_or(String::new(), |c| {
        format!(", {:.2}x the raw half round trip", c.median.ratio)
    });
    Some(format!(
        "send_lat 64 B busy-poll median: RC {:.2} us, UC {:.2} us (no ACK{uc_vs_raw}): the ACK costs {:.2} us of each half",
        rc.median_us,
        uc.median_us,
        rc.median_us - uc.median_us
    ))
}

/// The report's targets as a table: ratio, threshold, met or not, and the goal where there
/// is one.
pub fn render(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n== Targets (ratios of figures measured side by side above) =="
    );
    let yes_no = |m: Option<bool>| match m {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    };
    let cols = [
        left("target", 62),
        right("ratio", 7),
        right("needed", 8),
        right("met", 5),
        right("goal", 8),
        right("met", 5),
    ];
    let rows = r.targets.iter().map(|t| {
        let sign = match t.bound {
            Bound::AtLeast => ">=",
            Bound::AtMost => "<=",
        };
        vec![
            t.name.to_string(),
            t.ratio.map_or("not run".into(), |r| format!("{r:.2}")),
            format!("{sign}{:.2}", t.threshold),
            yes_no(t.met()).to_string(),
            t.goal.map_or(String::new(), |g| format!("{sign}{g:.2}")),
            t.goal.map_or("", |_| yes_no(t.goal_met())).to_string(),
        ]
    });
    table(&mut s, "", &cols, rows);
    // The reference's own tail says how noisy the machine was during the run.
    if let Some(ping) = r.ceiling.as_ref().and_then(|c| {
        c.pingpongs
            .iter()
            .find(|p| p.payload == 64 && p.mode == Progress::BusyPoll && p.link_mtu == BASE_MTU)
    }) {
        let _ = writeln!(
            s,
            "(the raw AF_XDP ping-pong's own p99 / median in this run: {:.2})",
            ping.rtt_p99_us / ping.rtt_median_us
        );
    }
    if let Some(line) = ack_share(r) {
        let _ = writeln!(s, "{line}");
    }
    if let Some(h) = &r.machine.hiccups {
        for l in ["send_lat", "write_lat"]
            .into_iter()
            .filter_map(|test| busy_poll_64(r, test))
        {
            let _ = writeln!(s, "{}", tail_against_hiccups(l.test, l.median_us, h));
        }
    }
    s
}

/// Whether a busy-poll latency row's p99 can be its own on this machine: its round trip
/// (twice the half it reports) against the longest one the machine's hiccups leave clear.
pub fn tail_against_hiccups(test: &str, median_half_us: f64, h: &Hiccups) -> String {
    let round_trip = 2.0 * median_half_us;
    match h.clear_round_trip_us() {
        Some(clear) if round_trip > clear => format!(
            "{test}'s round trip ({round_trip:.1} us) is longer than the {clear:.1} us the machine's hiccups leave clear: \
             more than 1 % of its round trips meet one, so its p99 is partly the machine's"
        ),
        Some(clear) => format!(
            "{test}'s round trip ({round_trip:.1} us) is within the {clear:.1} us the machine's hiccups leave clear: its p99 is its own"
        ),
        None => format!("{test}: no hiccups measured, its p99 is its own"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_longer_than_the_hiccups_allow_is_said_to_share_its_tail() {
        // 1,250 hiccups a second: one every 800 us, 1 % of which is 8 us.
        let h = Hiccups {
            seconds: 1.0,
            per_second: 1250.0,
            median_us: Some(8.0),
            p90_us: Some(15.0),
            median_interval_us: Some(800.0),
        };
        let long = tail_against_hiccups("send_lat", 5.5, &h);
        assert!(
            long.contains("(11.0 us) is longer than the 8.0 us"),
            "{long}"
        );
        let short = tail_against_hiccups("write_lat", 3.5, &h);
        assert!(
            short.contains("(7.0 us) is within the 8.0 us") && short.ends_with("its own"),
            "{short}"
        );
        let none = Hiccups {
            per_second: 0.0,
            median_us: None,
            p90_us: None,
            median_interval_us: None,
            ..h
        };
        assert!(tail_against_hiccups("send_lat", 50.0, &none).ends_with("its own"));
    }
}
