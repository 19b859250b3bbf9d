//! Running a plan: the namespaces and veth pairs, the children in them, each row measured.
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

use super::child::{ChildRole, ChildSpec, Pinged, QpMemory, Received, Sent};
use xroce::netns::{LinkConfig, Netns, VethLink};

use super::*;

/// A child process whose stdout lines arrive on a channel and whose stderr is collected;
/// killed and reaped when dropped.
pub(super) struct Proc {
    child: std::process::Child,
    what: String,
    lines: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub(super) fn spawn(
        ns: &Netns,
        exe: &std::path::Path,
        args: &[String],
        what: String,
    ) -> anyhow::Result<Proc> {
        let mut cmd = ns.command(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Self::start(child, what)
    }

    pub(super) fn spawn_here(
        exe: &std::path::Path,
        args: &[String],
        what: String,
    ) -> anyhow::Result<Proc> {
        let mut cmd = std::process::Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Self::start(child, what)
    }

    pub(super) fn start(mut child: std::process::Child, what: String) -> anyhow::Result<Proc> {
        let stdout = child.stdout.take().context("child stdout")?;
        let mut stderr_pipe = child.stderr.take().context("child stderr")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        Ok(Proc {
            child,
            what,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    pub(super) fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// The next stdout line, or an error naming the child and what it said on stderr.
    pub(super) fn line(&self, timeout: Duration) -> anyhow::Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!(
                    "{}: no answer within {:?}{}",
                    self.what,
                    timeout,
                    self.said()
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Give the stderr reader a moment to catch the last words.
                std::thread::sleep(Duration::from_millis(50));
                bail!("{}: exited{}", self.what, self.said())
            }
        }
    }

    pub(super) fn said(&self) -> String {
        let e = self.stderr_text();
        if e.is_empty() {
            String::new()
        } else {
            format!(": {}", last_lines(&e, 3))
        }
    }

    pub(super) fn expect_ready(&self) -> anyhow::Result<()> {
        let l = self.line(READY_TIMEOUT)?;
        if l != "READY" {
            bail!("{}: said {l:?} instead of READY", self.what);
        }
        Ok(())
    }

    pub(super) fn result<T: for<'de> Deserialize<'de>>(
        &self,
        timeout: Duration,
    ) -> anyhow::Result<T> {
        let l = self.line(timeout)?;
        serde_json::from_str(&l).with_context(|| format!("{}: unreadable result {l:?}", self.what))
    }

    /// Waits for the process to exit; kills it after `timeout`. Returns its stdout.
    pub(super) fn finish(mut self, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                bail!(
                    "{}: still running after {:?}, killed{}",
                    self.what,
                    timeout,
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(r) = self.stderr_reader.take() {
            let _ = r.join();
        }
        let out: Vec<String> = self.lines.try_iter().collect();
        if !status.success() {
            bail!("{}: {status}{}", self.what, self.said());
        }
        Ok(out.join("\n"))
    }
}

pub(super) fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// The two sides of a link, as the roles need them.
pub(super) struct Side<'a> {
    ns: &'a Netns,
    ifname: &'a str,
    ip: std::net::Ipv4Addr,
    mac: [u8; 6],
}

pub(super) fn sides(link: &VethLink) -> (Side<'_>, Side<'_>) {
    (
        Side {
            ns: &link.a,
            ifname: &link.a_if,
            ip: link.a_ip,
            mac: link.a_mac,
        },
        Side {
            ns: &link.b,
            ifname: &link.b_if,
            ip: link.b_ip,
            mac: link.b_mac,
        },
    )
}

pub(super) struct Runner<'a> {
    opts: &'a BenchOptions,
    log: &'a mut dyn Write,
    failures: Vec<String>,
    xdp_mode: Option<String>,
    step: usize,
    steps: usize,
}

impl Runner<'_> {
    pub(super) fn note(&mut self, what: &str) {
        self.step += 1;
        let _ = writeln!(self.log, "[{}/{}] {what}", self.step, self.steps);
        let _ = self.log.flush();
    }

    fn failed(&mut self, what: &str, e: &anyhow::Error) {
        let msg = format!("{what}: {e:#}");
        let _ = writeln!(self.log, "  FAILED: {msg}");
        self.failures.push(msg);
    }

    /// One step: says `what`, runs it, records it among the failures if it fails (the
    /// error's text is then the result).
    pub(super) fn attempt<T>(
        &mut self,
        what: &str,
        step: impl FnOnce(&mut Self) -> anyhow::Result<T>,
    ) -> Result<T, String> {
        self.note(what);
        step(self).map_err(|e| {
            self.failed(what, &e);
            format!("{e:#}")
        })
    }

    pub(super) fn child(
        &self,
        side: &Side,
        peer: &Side,
        role: ChildRole,
        size: u64,
        count: u64,
        busy: bool,
    ) -> anyhow::Result<Proc> {
        let spec = ChildSpec {
            role,
            ifname: side.ifname.to_string(),
            local_ip: side.ip,
            peer_ip: peer.ip,
            peer_mac: peer.mac,
            size: size as usize,
            count,
            busy,
            qps: 0,
        };
        let args = vec!["bench-child".to_string(), serde_json::to_string(&spec)?];
        Proc::spawn(
            side.ns,
            &self.opts.exe,
            &args,
            format!("bench-child {role:?} in {}", side.ns.name()),
        )
    }

    /// One direction of a stream: the receiver first, then the sender.
    pub(super) fn stream(
        &mut self,
        link: &VethLink,
        xdp: bool,
        payload: u64,
        a_to_b: bool,
    ) -> anyhow::Result<StreamRow> {
        let (a, b) = sides(link);
        let (from, to) = if a_to_b { (&a, &b) } else { (&b, &a) };
        let count = self.opts.messages_for(payload);
        let (send_role, recv_role) = if xdp {
            (ChildRole::XdpSend, ChildRole::XdpRecv)
        } else {
            (ChildRole::UdpSend, ChildRole::UdpRecv)
        };
        let rx = self.child(to, from, recv_role, payload, count, false)?;
        rx.expect_ready()?;
        let tx = self.child(from, to, send_role, payload, count, false)?;
        tx.expect_ready()?;
        let sent: Sent = tx.result(Duration::from_secs(300))?;
        let got: Received = rx.result(Duration::from_secs(30))?;
        if xdp {
            self.xdp_mode.get_or_insert(got.mode.clone());
        }
        if got.received == 0 || got.seconds <= 0.0 {
            bail!("the receiver got {} of {} packets", got.received, sent.sent);
        }
        let frame_bytes = if xdp {
            got.bytes / got.received
        } else {
            // Ethernet 14 + IPv4 20 + UDP 8 in front of each datagram (one fragment).
            payload + 42
        };
        let pps = got.received as f64 / got.seconds;
        Ok(StreamRow {
            link_mtu: link.mtu,
            direction: if a_to_b { "A->B" } else { "B->A" },
            payload,
            frame_bytes,
            sent: sent.sent,
            received: got.received,
            loss_percent: 100.0 * (1.0 - got.received as f64 / sent.sent.max(1) as f64),
            packets_per_sec: pps,
            sender_packets_per_sec: sent.sent as f64 / sent.seconds.max(1e-9),
            wire_gbps: pps * frame_bytes as f64 * 8.0 / 1e9,
            payload_gbps: pps * payload as f64 * 8.0 / 1e9,
        })
    }

    /// A ping-pong: the echo in B, the pinger in A.
    pub(super) fn pingpong(
        &mut self,
        link: &VethLink,
        xdp: bool,
        size: u64,
        mode: Progress,
    ) -> anyhow::Result<PingRow> {
        let (a, b) = sides(link);
        let busy = mode == Progress::BusyPoll;
        let (ping_role, echo_role) = if xdp {
            (ChildRole::XdpPing, ChildRole::XdpEcho)
        } else {
            (ChildRole::UdpPing, ChildRole::UdpEcho)
        };
        let iters = self.opts.lat_iters();
        let echo = self.child(&b, &a, echo_role, size, 0, busy)?;
        echo.expect_ready()?;
        let ping = self.child(&a, &b, ping_role, size, iters, busy)?;
        ping.expect_ready()?;
        let r: Pinged = ping.result(Duration::from_secs(60) + Duration::from_millis(iters))?;
        drop(echo);
        Ok(PingRow {
            link_mtu: link.mtu,
            mode,
            payload: size,
            round_trips: r.answered,
            lost: r.lost,
            rtt_median_us: r.rtt.median,
            rtt_p99_us: r.rtt.p99,
            half_rtt_median_us: r.rtt.median / 2.0,
            half_rtt_p99_us: r.rtt.p99 / 2.0,
        })
    }

    /// One `xroce perf` pair: the server in B, the client in A; the client's first result.
    pub(super) fn perf(
        &mut self,
        link: &VethLink,
        case: &BwCase,
        mode: Option<Progress>,
    ) -> anyhow::Result<PerfResult> {
        let doc = self.perf_doc(link, case, mode)?;
        parse_perf(&doc).with_context(|| {
            format!(
                "xroce perf {} -s {}: reading its --json",
                case.test, case.size
            )
        })
    }

    /// perftest's binary of `case` on xroce's library: `xroce run -d <veth> -- ib_<test>`,
    /// the server in B, the client in A; the client's result row.
    pub(super) fn perftest(
        &mut self,
        link: &VethLink,
        case: &BwCase,
    ) -> anyhow::Result<PerfResult> {
        let binary = format!("ib_{}", case.test);
        let latency = case.test.ends_with("_lat");
        let args = |ifname: &str| -> Vec<String> {
            let mut v: Vec<String> = ["run", "-d", ifname, "--", &binary, "-d"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.push(format!("xroce_{ifname}"));
            v.extend(
                [
                    "-x",
                    "1",
                    "-s",
                    &case.size.to_string(),
                    "-n",
                    &case.iters.to_string(),
                    "-p",
                    &PERFTEST_PORT.to_string(),
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            if !latency {
                v.push("--report_gbits".into());
            }
            v
        };
        let out = self.server_then_client(
            link,
            args,
            &format!("{binary} on the library"),
            // perftest says nothing machine-readable when it listens.
            ServerReady::After(Duration::from_millis(700)),
        )?;
        parse_perftest(&out, latency).with_context(|| format!("{binary} client's output"))
    }

    /// One `xroce perf` pair: the server in B, the client in A; the client's JSON document.
    pub(super) fn perf_doc(
        &mut self,
        link: &VethLink,
        case: &BwCase,
        mode: Option<Progress>,
    ) -> anyhow::Result<String> {
        let BwCase {
            test,
            size,
            qps,
            iters,
            threads,
            shards,
        } = *case;
        // The UC row is perf's send_lat on a UC QP.
        let (subcommand, connection) = match test {
            UC_SEND_LAT => ("send_lat", Some("UC")),
            _ => (test, None),
        };
        let common = |ifname: &str| {
            let mut v: Vec<String> = [
                "perf",
                subcommand,
                "-d",
                ifname,
                "-s",
                &size.to_string(),
                "-n",
                &iters.to_string(),
                "-p",
                &PERF_PORT.to_string(),
                "--json",
                "--report_gbits",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if qps > 1 {
                v.extend(["-q".to_string(), qps.to_string()]);
            }
            if let Some(c) = connection {
                v.extend(["-c".to_string(), c.to_string()]);
            }
            if threads > 1 {
                v.extend(["--threads".to_string(), threads.to_string()]);
            }
            if shards > 1 {
                v.extend(["--shards".to_string(), shards.to_string()]);
            }
            if let (Some(m), true) = (mode, self.opts.perf_has_progress) {
                v.extend(["--progress".to_string(), m.name().to_string()]);
            }
            v
        };
        self.server_then_client(
            link,
            common,
            &format!("xroce perf {test}"),
            // With --json the server says so on stderr.
            ServerReady::Says("Waiting for client"),
        )
    }

    /// A server in B with `args(B's interface)`, then, once it is ready, a client in A with
    /// `args(A's interface)` and B's address; the client's stdout.
    fn server_then_client(
        &mut self,
        link: &VethLink,
        args: impl Fn(&str) -> Vec<String>,
        what: &str,
        ready: ServerReady,
    ) -> anyhow::Result<String> {
        let mut server = Proc::spawn(
            &link.b,
            &self.opts.exe,
            &args(&link.b_if),
            format!("{what} server"),
        )?;
        let deadline = Instant::now()
            + match ready {
                ServerReady::After(pause) => pause,
                ServerReady::Says(_) => READY_TIMEOUT,
            };
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("{what} server: {status}{}", server.said());
            }
            match ready {
                ServerReady::Says(line) if server.stderr_text().contains(line) => break,
                ServerReady::Says(_) if Instant::now() > deadline => bail!(
                    "{what} server: not listening after {READY_TIMEOUT:?}{}",
                    server.said()
                ),
                ServerReady::After(_) if Instant::now() >= deadline => break,
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let mut client_args = args(&link.a_if);
        client_args.push(link.b_ip.to_string());
        let client = Proc::spawn(
            &link.a,
            &self.opts.exe,
            &client_args,
            format!("{what} client"),
        )?;
        // Generous: the rows are sized to take a second or two.
        let out = client.finish(Duration::from_secs(180))?;
        let _ = server.finish(Duration::from_secs(10));
        Ok(out)
    }
}

/// When a server started by [`Runner::server_then_client`] is ready for its client.
#[derive(Clone, Copy)]
enum ServerReady {
    /// After this long, if it is still running (it says nothing machine-readable).
    After(Duration),
    /// When its stderr contains this.
    Says(&'static str),
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bandwidth result's figures.
#[derive(Debug, Clone, Copy)]
pub struct BwFigures {
    /// Average Gbit/s.
    pub gbps: f64,
    /// Peak Gbit/s.
    pub peak_gbps: f64,
    /// Million messages per second.
    pub msg_rate_mpps: f64,
}

impl PerfResult {
    /// A bandwidth test's figures; an error for a latency result.
    pub fn bw(self) -> anyhow::Result<BwFigures> {
        match self {
            PerfResult::Bw {
                gbps,
                peak_gbps,
                msg_rate_mpps,
            } => Ok(BwFigures {
                gbps,
                peak_gbps,
                msg_rate_mpps,
            }),
            other => bail!("not a bandwidth result: {other:?}"),
        }
    }

    /// A latency test's median and p99 (us); an error for a bandwidth result.
    pub fn lat(self) -> anyhow::Result<(f64, f64)> {
        match self {
            PerfResult::Lat { median, p99 } => Ok((median, p99)),
            other => bail!("not a latency result: {other:?}"),
        }
    }

    /// The headline figure: Gbit/s average or median latency.
    pub fn figure(&self) -> f64 {
        match *self {
            PerfResult::Bw { gbps, .. } => gbps,
            PerfResult::Lat { median, .. } => median,
        }
    }
}

/// What `xroce perf --json` reported for one size.
#[derive(Debug, Clone, PartialEq)]
pub enum PerfResult {
    /// A bandwidth test (Gbit/s with --report_gbits).
    Bw {
        /// Average.
        gbps: f64,
        /// Peak.
        peak_gbps: f64,
        /// Mpps.
        msg_rate_mpps: f64,
    },
    /// A latency test (µs).
    Lat {
        /// t_typical.
        median: f64,
        /// 99% percentile.
        p99: f64,
    },
}

/// Reads the first result of an `xroce perf --json` document.
pub fn parse_perf(doc: &str) -> anyhow::Result<PerfResult> {
    let v: serde_json::Value = serde_json::from_str(doc)?;
    let r = v["results"]
        .get(0)
        .ok_or_else(|| anyhow!("no results in {doc}"))?;
    let num = |k: &str| r[k].as_f64().ok_or_else(|| anyhow!("no {k:?} in {r}"));
    if r.get("median").is_some() {
        Ok(PerfResult::Lat {
            median: num("median")?,
            p99: num("p99")?,
        })
    } else {
        if r["unit"] != "GigabitsPerSec" {
            bail!("expected Gb/s (--report_gbits), got {}", r["unit"]);
        }
        Ok(PerfResult::Bw {
            gbps: num("average")?,
            peak_gbps: num("peak")?,
            msg_rate_mpps: num("msg_rate_mpps")?,
        })
    }
}

/// Each thread's message rate in an `xroce perf --json` document's first result (an older
/// perf without `per_thread`: none).
pub fn parse_per_thread_mpps(doc: &str) -> anyhow::Result<Vec<f64>> {
    let v: serde_json::Value = serde_json::from_str(doc)?;
    let Some(threads) = v["results"][0]["per_thread"].as_array() else {
        return Ok(Vec::new());
    };
    threads
        .iter()
        .map(|t| {
            t["msg_rate_mpps"]
                .as_f64()
                .ok_or_else(|| anyhow!("no \"msg_rate_mpps\" in {t}"))
        })
        .collect()
}

/// /proc/loadavg's three averages (zeros where it cannot be read).
pub(super) fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut avg = [0.0; 3];
    for (slot, v) in avg.iter_mut().zip(text.split_whitespace()) {
        *slot = v.parse().unwrap_or(0.0);
    }
    avg
}

pub(super) fn read_machine(link_desc: String) -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    Machine {
        started_utc: utc_now(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_average: load_average(),
        load_average_end: [0.0; 3],
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        xdp_mode: None,
        link: link_desc,
        hiccups: None,
    }
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC` (days to a civil date: the proleptic Gregorian rule).
pub(super) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Which way a test's data flows: read_bw's responses go from B (server) to A (client).
pub(super) fn data_direction(test: &str) -> &'static str {
    if test.starts_with("read") {
        "B->A"
    } else {
        "A->B"
    }
}

pub(super) fn stream_ref<'a>(
    sec: &'a Option<RawSection>,
    mtu: u32,
    payload: u64,
    dir: &str,
) -> Option<&'a StreamRow> {
    sec.as_ref()?
        .streams
        .iter()
        .find(|r| r.link_mtu == mtu && r.payload == payload && r.direction == dir)
}

pub(super) fn ping_ref(
    sec: &Option<RawSection>,
    mtu: u32,
    size: u64,
    mode: Progress,
) -> Option<&PingRow> {
    sec.as_ref()?
        .pingpongs
        .iter()
        .find(|r| r.link_mtu == mtu && r.payload == size && r.mode == mode)
}

pub(super) fn bw_ratio(
    sec: &Option<RawSection>,
    name: &str,
    mtu: u32,
    payload: u64,
    dir: &str,
    gbps: f64,
) -> Option<Ratio> {
    let r = stream_ref(sec, mtu, payload, dir)?;
    Ratio::new(
        format!("{name} stream {dir}, {payload} B per packet, MTU {mtu}: payload Gbit/s"),
        r.payload_gbps,
        gbps,
    )
}

pub(super) fn lat_ratios(
    sec: &Option<RawSection>,
    name: &str,
    row: &XroceLatRow,
) -> Option<LatencyRatios> {
    let (mtu, size, mode) = (row.link_mtu, row.size, row.mode);
    let r = ping_ref(sec, mtu, size, mode)?;
    let full_rtt = row.measures == "round trip";
    let (what, m, p) = if full_rtt {
        ("round trip", r.rtt_median_us, r.rtt_p99_us)
    } else {
        ("half round trip", r.half_rtt_median_us, r.half_rtt_p99_us)
    };
    let reference = |stat: &str| {
        format!(
            "{name} ping-pong {size} B, MTU {mtu}, {}: {stat} {what} (us)",
            mode.name()
        )
    };
    Some(LatencyRatios {
        median: Ratio::new(reference("median"), m, row.median_us)?,
        p99: Ratio::new(reference("p99"), p, row.p99_us)?,
    })
}

/// Runs the bench. Progress lines go to `log` (stderr); the result is the report.
pub fn run(opts: &BenchOptions, log: &mut dyn Write) -> anyhow::Result<BenchReport> {
    opts.validate()?;
    let started = Instant::now();
    let plan = plan(opts);
    let pairs: Vec<String> = plan
        .links
        .iter()
        .map(|l| {
            format!(
                "MTU {} with {} queue{} per end",
                l.mtu,
                l.queues,
                if l.queues == 1 { "" } else { "s" }
            )
        })
        .collect();
    let mut machine = read_machine(if pairs.is_empty() {
        "none: no section that ran needs one".to_string()
    } else {
        format!(
            "veth pairs between two network namespaces, 198.18.0.1 (A) and 198.18.0.2 (B), one after the other: {}",
            pairs.join("; ")
        )
    });
    let raw_steps =
        |l: &LinkPlan| l.stream_payloads.len() * 2 + l.ping_sizes.len() * opts.modes.len();
    let steps: usize = plan
        .links
        .iter()
        .map(|l| {
            let mut n =
                l.bw.len() + l.lat.len() + l.scale.len() + l.threads.len() + 2 * l.library.len();
            if opts.runs(Section::Ceiling) {
                n += raw_steps(l);
            }
            if opts.runs(Section::Udp) {
                n += raw_steps(l);
            }
            n
        })
        .sum::<usize>()
        + plan.memory_qps.len()
        + usize::from(opts.runs(Section::Engine));
    // Before anything else runs: the machine's own hiccups, which set a floor under every
    // ping-pong's tail.
    machine.hiccups = Some(super::hiccups::measure(Duration::from_secs_f64(
        if opts.quick { 0.2 } else { 1.0 },
    )));
    let mut runner = Runner {
        opts,
        log,
        failures: Vec::new(),
        xdp_mode: None,
        step: 0,
        steps,
    };
    let mut ceiling = opts.runs(Section::Ceiling).then(RawSection::default);
    let mut udp = opts.runs(Section::Udp).then(RawSection::default);
    let mut bw_raw: Vec<(u32, u32, BwCase, BwFigures)> = Vec::new();
    let mut library_rows: Vec<LibraryRow> = Vec::new();
    let mut lat_raw: Vec<(u32, LatCase, f64, f64)> = Vec::new();
    let mut scale_raw: Vec<(BwCase, f64, f64)> = Vec::new();
    // Gbit/s, Mmsg/s and each thread's Mmsg/s, or the failure's text.
    type ThreadsOutcome = Result<(f64, f64, Vec<f64>), String>;
    let mut threads_raw: Vec<(BwCase, ThreadsOutcome)> = Vec::new();
    let mut links = Vec::new();

    for lp in &plan.links {
        let link = VethLink::create(&LinkConfig {
            mtu: lp.mtu,
            ipv6: false,
            queues: lp.queues,
            ..LinkConfig::default()
        })
        .with_context(|| format!("creating the namespaces and the veth pair (MTU {})", lp.mtu))?;
        link.add_static_neighbours()
            .context("adding the neighbour entries")?;
        let mut used = Vec::new();
        for (section, xdp, name) in [(&mut ceiling, true, "ceiling"), (&mut udp, false, "udp")] {
            let Some(sec) = section.as_mut() else {
                continue;
            };
            for &payload in &lp.stream_payloads {
                for a_to_b in [true, false] {
                    let what = format!(
                        "{name} stream {payload} B {} MTU {}",
                        if a_to_b { "A->B" } else { "B->A" },
                        lp.mtu
                    );
                    if let Ok(r) = runner.attempt(&what, |r| r.stream(&link, xdp, payload, a_to_b))
                    {
                        sec.streams.push(r);
                    }
                }
            }
            for &size in &lp.ping_sizes {
                for &mode in &opts.modes {
                    let what = format!("{name} ping-pong {size} B {} MTU {}", mode.name(), lp.mtu);
                    if let Ok(r) = runner.attempt(&what, |r| r.pingpong(&link, xdp, size, mode)) {
                        sec.pingpongs.push(r);
                    }
                }
            }
            if !lp.stream_payloads.is_empty() {
                used.push(name.to_string());
            }
        }
        for case in &lp.bw {
            let what = format!(
                "xroce perf {} -s {} -q {} -n {} MTU {}",
                case.test, case.size, case.qps, case.iters, lp.mtu
            );
            if let Ok(bw) = runner.attempt(&what, |r| r.perf(&link, case, None)?.bw()) {
                bw_raw.push((lp.mtu, lp.path_mtu, case.clone(), bw));
            }
        }
        for case in &lp.lat {
            let what = format!(
                "xroce perf {} -s {} -n {} --progress {} MTU {}",
                if case.test == UC_SEND_LAT {
                    "send_lat -c UC"
                } else {
                    case.test
                },
                case.size,
                case.iters,
                case.mode.name(),
                lp.mtu
            );
            let one = BwCase {
                test: case.test,
                size: case.size,
                qps: 1,
                iters: case.iters,
                threads: 1,
                shards: opts.shards,
            };
            if let Ok((median, p99)) =
                runner.attempt(&what, |r| r.perf(&link, &one, Some(case.mode))?.lat())
            {
                lat_raw.push((lp.mtu, case.clone(), median, p99));
            }
        }
        if !lp.bw.is_empty() || !lp.lat.is_empty() {
            used.push("xroce".into());
        }
        for case in &lp.scale {
            let what = format!(
                "scale: xroce perf write_bw -s {} -q {} -n {} MTU {}",
                case.size, case.qps, case.iters, lp.mtu
            );
            if let Ok(bw) = runner.attempt(&what, |r| r.perf(&link, case, None)?.bw()) {
                scale_raw.push((case.clone(), bw.gbps, bw.msg_rate_mpps));
            }
        }
        if !lp.scale.is_empty() {
            used.push("scale".into());
        }
        for case in &lp.threads {
            let what = format!(
                "threads: xroce perf {} -s {} -q {} --threads {} --shards {} -n {} MTU {}, {} queues",
                case.test, case.size, case.qps, case.threads, case.shards, case.iters, lp.mtu, lp.queues
            );
            let outcome = runner.attempt(&what, |r| {
                let doc = r.perf_doc(&link, case, None)?;
                let bw = parse_perf(&doc)?.bw()?;
                Ok((bw.gbps, bw.msg_rate_mpps, parse_per_thread_mpps(&doc)?))
            });
            threads_raw.push((case.clone(), outcome));
        }
        if !lp.threads.is_empty() {
            used.push("threads".into());
        }
        for case in &lp.library {
            let what = format!(
                "library: ib_{} -s {} -n {} through xroce run, MTU {}",
                case.test, case.size, case.iters, lp.mtu
            );
            let perftest = runner.attempt(&what, |r| r.perftest(&link, case));
            let what = format!(
                "library: xroce perf {} -s {} -n {} beside it",
                case.test, case.size, case.iters
            );
            let perf = runner.attempt(&what, |r| r.perf(&link, case, None));
            if let (Ok(p), Ok(x)) = (perftest, perf) {
                library_rows.push(LibraryRow::new(case, p, x));
            }
        }
        if !lp.library.is_empty() {
            used.push("library".into());
        }
        links.push(LinkFacts {
            mtu: lp.mtu,
            path_mtu: lp.path_mtu,
            queues: lp.queues,
            used_for: used.join(", "),
        });
        drop(link);
    }

    let mut memory = Vec::new();
    for &qps in &plan.memory_qps {
        let what = format!("memory of {qps} connected QP pairs (two in-memory devices)");
        if let Ok(m) = runner.attempt(&what, |_| measure_memory(opts, qps)) {
            memory.push(m);
        }
    }
    // Last, with every child gone: it has the core to itself.
    let engine = if opts.runs(Section::Engine) {
        let duration = Duration::from_secs_f64(if opts.quick { 0.5 } else { 3.0 });
        let what = format!(
            "engine alone: {} B SENDs between two engines in memory, {:.1} s",
            super::engine::ENGINE_MESSAGE,
            duration.as_secs_f64()
        );
        runner
            .attempt(&what, |_| super::engine::measure(duration))
            .ok()
    } else {
        None
    };
    machine.xdp_mode = runner.xdp_mode.clone();
    machine.load_average_end = load_average();

    let xroce = opts.runs(Section::Xroce).then(|| XroceSection {
        bw: bw_raw
            .iter()
            .map(|(mtu, pmtu, c, bw)| {
                let payload = c.size.min(u64::from(*pmtu));
                let dir = data_direction(c.test);
                XroceBwRow {
                    test: c.test,
                    link_mtu: *mtu,
                    path_mtu: *pmtu,
                    size: c.size,
                    qps: c.qps,
                    iters: c.iters,
                    gbps: bw.gbps,
                    peak_gbps: bw.peak_gbps,
                    msg_rate_mpps: bw.msg_rate_mpps,
                    vs_ceiling: bw_ratio(&ceiling, "ceiling", *mtu, payload, dir, bw.gbps),
                    vs_udp: bw_ratio(&udp, "udp", *mtu, payload, dir, bw.gbps),
                }
            })
            .collect(),
        lat: lat_raw
            .iter()
            .map(|(mtu, c, median, p99)| {
                let full = c.test.starts_with("read");
                let mut row = XroceLatRow {
                    test: c.test,
                    mode: c.mode,
                    link_mtu: *mtu,
                    size: c.size,
                    iters: c.iters,
                    measures: if full {
                        "round trip"
                    } else {
                        "half round trip"
                    },
                    median_us: *median,
                    p99_us: *p99,
                    vs_ceiling: None,
                    vs_udp: None,
                };
                row.vs_ceiling = lat_ratios(&ceiling, "ceiling", &row);
                row.vs_udp = lat_ratios(&udp, "udp", &row);
                row
            })
            .collect(),
    });
    let scale = opts.runs(Section::Scale).then(|| {
        let pmtu = u64::from(path_mtu(BASE_MTU));
        let rows = scale_raw
            .iter()
            .map(|(c, gbps, mpps)| {
                let one = scale_raw.iter().find(|(o, _, _)| o.qps == 1 && o.size == c.size);
                ScaleRow {
                    size: c.size,
                    qps: c.qps,
                    iters: c.iters,
                    gbps: *gbps,
                    msg_rate_mpps: *mpps,
                    vs_one_qp: one.and_then(|(_, g, _)| {
                        Ratio::new(format!("write_bw {} B with 1 QP: payload Gbit/s", c.size), *g, *gbps)
                    }),
                    vs_ceiling: bw_ratio(&ceiling, "ceiling", BASE_MTU, c.size.min(pmtu), "A->B", *gbps),
                }
            })
            .collect();
        ScaleSection {
            link_mtu: BASE_MTU,
            rows,
            memory,
            memory_method: format!(
                "VmRSS of a fresh process (xroce bench-child) with two in-memory devices, before and after creating N QPs on each (xroce perf write_bw's queue depths, CQ and buffer: -s {}), connecting them pairwise and writing each buffer once; the growth divided by 2N. The devices themselves (and the AF_XDP UMEM a real device has, per device not per QP) are left out. With few QPs the growth is within the allocator's granularity (4 KiB pages, heap slack): the 1024-QP row is the figure.",
                MEMORY_SIZE
            ),
        }
    });
    let threads = opts.runs(Section::Threads).then(|| {
        let rows = threads_raw
            .iter()
            .map(|(c, outcome)| {
                let one = threads_raw.iter().find_map(|(o, r)| {
                    (o.test == c.test && o.threads == 1 && o.shards == 1)
                        .then(|| r.as_ref().ok().map(|(_, mpps, _)| *mpps))
                        .flatten()
                });
                let (gbps, mpps, per_thread, error) = match outcome {
                    Ok((g, m, p)) => (Some(*g), Some(*m), p.clone(), None),
                    Err(e) => (None, None, Vec::new(), Some(e.clone())),
                };
                ThreadsRow {
                    test: c.test,
                    size: c.size,
                    qps: c.qps,
                    threads: c.threads,
                    shards: c.shards,
                    iters: c.iters,
                    msg_rate_mpps: mpps,
                    gbps,
                    per_thread_mpps: per_thread,
                    vs_one_thread: one.zip(mpps).and_then(|(o, m)| {
                        Ratio::new(
                            format!(
                                "{} {} B, {} QPs, 1 thread, 1 shard: Mmsg/s",
                                c.test, c.size, c.qps
                            ),
                            o,
                            m,
                        )
                    }),
                    error,
                }
            })
            .collect();
        ThreadsSection {
            link_mtu: BASE_MTU,
            queues: THREAD_QUEUES,
            rows,
        }
    });
    // Notes on the rows measured over links; the engine section alone has none of them.
    let on_links = opts.sections.iter().any(|s| *s != Section::Engine);
    let mut notes = vec![
        "Throughput ratios are xroce / reference: above 1 is faster. Latency ratios are xroce time / reference time: below 1 is faster.".to_string(),
        "Each xroce bandwidth row is compared with the stream of the same payload per packet (the message size up to the path MTU) in the direction its data flows (read_bw: B->A).".to_string(),
        "Latency: send_lat and write_lat print half a round trip, as perftest and sockperf do, and are compared with half the ping-pong's round trip; read_lat prints a whole round trip and is compared with the whole.".to_string(),
        "Latency statistics (median, p99) are computed as perftest computes them (tools/src/perftest/stats.rs), for the ping-pongs too.".to_string(),
        format!("The 4 KiB rows ran on a second veth pair at MTU {} (path MTU {}): one 4 KiB message per packet.", opts.jumbo_mtu, path_mtu(opts.jumbo_mtu)),
    ];
    if !on_links {
        notes.clear();
    }
    if machine.cores <= 2 && on_links {
        notes.push(format!("This machine has {} cores: with busy-poll a spinning client and a spinning server fill it, so the busy-poll rows compete with everything else running (the load average is above).", machine.cores));
    }
    if opts.runs(Section::Threads) {
        notes.push(format!(
            "Threads: both sides run {THREAD_QPS} QPs split over --threads T (client and server alike), each thread polling its own QPs; with T = 2 that is 2 client threads and 2 server threads spinning, which fill a {}-core machine by themselves{}.",
            machine.cores,
            if machine.cores <= 2 {
                ": here the 2-thread rows compete with each other and with the progress threads, so they cannot show what two threads gain on a larger machine"
            } else {
                ""
            }
        ));
    }
    if opts.runs(Section::Library) {
        notes.push("Library: each perftest row ran on xroce's libibverbs.so.1 through `xroce run` right after `xroce perf`'s same test, size and count on the same veth pair; the ratio is perftest / xroce perf (for send_lat, above 1 is slower). Both use the library's and perf's default progress mode (wakeup).".into());
    }
    if opts.shards > 1 {
        notes.push(format!("--shards {}: the xroce and scale rows ran with {} engine shards on veth pairs with as many queues (the ceiling and UDP rows too).", opts.shards, opts.shards));
    }
    if opts.modes.contains(&Progress::BusyPoll) && !opts.perf_has_progress {
        notes.push("xroce perf has no --progress option in this build: the xroce latency rows ran in its default mode (wakeup) only.".into());
    }
    if machine.build == "debug" {
        notes.push(
            "A debug build: its figures mean little; measure with cargo build --release.".into(),
        );
    }
    let sections = Section::ALL.into_iter().filter(|s| opts.runs(*s)).collect();
    let mut report = BenchReport {
        machine,
        quick: opts.quick,
        sections,
        progress: opts.modes.clone(),
        links,
        ceiling,
        udp,
        xroce,
        scale,
        threads,
        library: opts
            .runs(Section::Library)
            .then_some(LibrarySection { rows: library_rows }),
        engine,
        targets: Vec::new(),
        notes,
        failures: runner.failures,
        seconds: started.elapsed().as_secs_f64(),
    };
    report.targets = targets::targets(&report);
    Ok(report)
}

/// The message size whose buffers the memory rows allocate (perf's smallest buffer, 2 x 4 KiB,
/// serves every size up to 4 KiB).
pub(super) const MEMORY_SIZE: u64 = 4096;

pub(super) fn measure_memory(opts: &BenchOptions, qps: usize) -> anyhow::Result<QpMemory> {
    let spec = ChildSpec {
        role: ChildRole::QpMemory,
        ifname: String::new(),
        local_ip: std::net::Ipv4Addr::UNSPECIFIED,
        peer_ip: std::net::Ipv4Addr::UNSPECIFIED,
        peer_mac: [0; 6],
        size: MEMORY_SIZE as usize,
        count: 0,
        busy: false,
        qps,
    };
    let args = vec!["bench-child".to_string(), serde_json::to_string(&spec)?];
    let p = Proc::spawn_here(&opts.exe, &args, format!("bench-child QpMemory {qps}"))?;
    p.expect_ready()?;
    let m: QpMemory = p.result(Duration::from_secs(120))?;
    Ok(m)
}
