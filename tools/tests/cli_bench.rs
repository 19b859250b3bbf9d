//! `xroce bench`: as root, `--quick --json` runs every section and prints a document whose
//! ratios are the figures they claim to divide; bad options and a missing root are clear
//! errors. Benchmarks are never timed tests: nothing here checks a speed.
use std::process::{Command, Output};

use serde_json::Value;

#[path = "../../tests/common/mod.rs"]
mod common;

fn xroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xroce"))
        .args(args)
        .output()
        .expect("running xroce")
}

/// Root, or a visible skip; under CI=1 or XROCE_CI=1 a missing root fails the test.
fn privileged(test: &str) -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "1" || v == "true");
    if ci && !xroce::netns::is_privileged() {
        panic!("{test}: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and CI=1 forbids skipping");
    }
    match xroce::netns::require_privileges(test) {
        Ok(go) => go,
        Err(msg) => panic!("{msg}"),
    }
}

fn refused(args: &[&str], message: &str) {
    let out = xroce(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "xroce {args:?} succeeded");
    assert!(stderr.contains(message), "xroce {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "xroce {args:?}: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "xroce {args:?} printed {:?}",
        out.stdout
    );
}

#[test]
fn bad_options_are_refused_before_anything_runs() {
    refused(
        &["bench", "--sections", "ceiling,nonsense"],
        "invalid value 'nonsense' for '--sections",
    );
    refused(
        &["bench", "--mtu", "1500"],
        "--mtu 1500: must be between 4176 and 9000",
    );
    refused(
        &["bench", "--mtu", "65000"],
        "--mtu 65000: must be between 4176 and 9000",
    );
    refused(
        &["bench", "-n", "0"],
        "-n/--iters 0: must be between 100 and",
    );
    refused(
        &["bench", "--messages", "0"],
        "--messages 0: must be between 100 and",
    );
    refused(
        &["bench", "--progress", "sometimes"],
        "invalid value 'sometimes' for '--progress",
    );
    refused(
        &["bench", "--shards", "0"],
        "--shards 0: must be between 1 and 64",
    );
    refused(
        &["bench", "--sections", "threads", "--shards", "65"],
        "--shards 65: must be between 1 and 64",
    );
}

#[test]
fn without_root_it_says_so() {
    // As root, drop to nobody with setpriv (util-linux); without it there is nothing to show.
    if !xroce::netns::is_privileged() {
        refused(&["bench", "--quick"], "xroce bench needs root");
        return;
    }
    match as_nobody(&["bench", "--quick"]) {
        Some(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            assert!(stderr.contains("xroce bench needs root"), "{stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
        None => common::report_skip("without_root_it_says_so", "setpriv cannot drop root here"),
    }
}

/// `xroce ARGS` run as nobody with no capabilities through setpriv (util-linux); `None` when
/// setpriv cannot drop root here (missing, or refused).
fn as_nobody(args: &[&str]) -> Option<Output> {
    let out = Command::new("setpriv")
        .args(common::SETPRIV_AS_NOBODY)
        .arg(env!("CARGO_BIN_EXE_xroce"))
        .args(args)
        .output()
        .ok()?;
    let refused =
        out.status.code() == Some(127) || String::from_utf8_lossy(&out.stderr).contains("setpriv:");
    (!refused).then_some(out)
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key:?} in {v}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// A ratio object divides `value` by `reference_value`; `value` is the row's own figure.
fn check_ratio(r: &Value, own: f64, reference: Option<f64>, what: &str) {
    assert!(r.is_object(), "{what}: no ratio: {r}");
    let (value, refv, ratio) = (num(r, "value"), num(r, "reference_value"), num(r, "ratio"));
    assert!(
        close(value, own),
        "{what}: ratio's value {value} is not the row's {own}"
    );
    if let Some(expected) = reference {
        assert!(
            close(refv, expected),
            "{what}: reference {refv} is not the row's {expected}"
        );
    }
    assert!(refv > 0.0, "{what}: {r}");
    assert!(
        close(ratio, value / refv),
        "{what}: {ratio} != {value} / {refv}"
    );
    assert!(
        r["reference"].as_str().is_some_and(|s| !s.is_empty()),
        "{what}: {r}"
    );
}

fn stream<'a>(sec: &'a Value, mtu: u64, payload: u64, dir: &str) -> &'a Value {
    sec["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["link_mtu"] == mtu && r["payload"] == payload && r["direction"] == dir)
        .unwrap_or_else(|| panic!("no stream row {mtu} {payload} {dir}"))
}

fn ping<'a>(sec: &'a Value, mtu: u64, size: u64, mode: &str) -> &'a Value {
    sec["pingpongs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["link_mtu"] == mtu && r["payload"] == size && r["mode"] == mode)
        .unwrap_or_else(|| panic!("no ping-pong row {mtu} {size} {mode}"))
}

fn check_raw_section(sec: &Value, name: &str) {
    let streams = sec["streams"].as_array().expect("streams");
    assert!(!streams.is_empty(), "{name}: no stream rows");
    for dir in ["A->B", "B->A"] {
        assert!(
            streams.iter().any(|r| r["direction"] == dir),
            "{name}: no {dir}"
        );
    }
    for r in streams {
        for k in ["packets_per_sec", "wire_gbps", "payload_gbps"] {
            assert!(num(r, k) > 0.0, "{name}: {k} in {r}");
        }
        let (sent, got) = (num(r, "sent"), num(r, "received"));
        assert!(got > 0.0 && got <= sent, "{name}: {r}");
        assert!(
            close(num(r, "loss_percent"), 100.0 * (1.0 - got / sent)),
            "{name}: {r}"
        );
    }
    let pings = sec["pingpongs"].as_array().expect("pingpongs");
    assert!(!pings.is_empty(), "{name}: no ping-pong rows");
    for r in pings {
        assert!(num(r, "round_trips") > 0.0, "{name}: {r}");
        let (m, p) = (num(r, "rtt_median_us"), num(r, "rtt_p99_us"));
        assert!(m > 0.0 && p >= m, "{name}: {r}");
        assert!(close(num(r, "half_rtt_median_us"), m / 2.0), "{name}: {r}");
        assert!(close(num(r, "half_rtt_p99_us"), p / 2.0), "{name}: {r}");
    }
}

#[test]
fn quick_json_has_every_section_and_consistent_ratios() {
    if !privileged("quick_json_has_every_section_and_consistent_ratios") {
        return;
    }
    let out = xroce(&["bench", "--quick", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xroce bench --quick --json failed:\n{stderr}\n{stdout}"
    );
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"));
    // The tables went to stderr, the machine facts and caveats with them.
    for s in [
        "== 1. Ceiling",
        "== 2. Kernel UDP",
        "== 3. xroce perf",
        "== 4. Scale",
        "== 5. Threads",
        "== 7. The engine alone",
        " tenths: ",
        "== Targets",
        "load average at start",
        "hiccups: a thread spinning for",
    ] {
        assert!(stderr.contains(s), "no {s:?} on stderr:\n{stderr}");
    }
    assert_eq!(
        doc["failures"].as_array().map(Vec::len),
        Some(0),
        "{}",
        doc["failures"]
    );
    assert_eq!(doc["quick"], true);
    // The engine alone: a rate of its own, and the target that reads it.
    let engine = &doc["engine"];
    assert!(
        num(engine, "msg_rate_mpps") > 0.0 && num(engine, "messages") > 0.0,
        "{engine}"
    );
    // The row's tenths: the rate in each tenth of its run, every one a rate.
    let tenths = engine["tenths_mpps"].as_array().expect("tenths_mpps");
    assert!(
        (1..=10).contains(&tenths.len())
            && tenths.iter().all(|t| t.as_f64().is_some_and(|r| r > 0.0)),
        "{engine}"
    );
    let target = doc["targets"]
        .as_array()
        .and_then(|t| {
            t.iter().find(|t| {
                t["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("engine alone"))
            })
        })
        .unwrap_or_else(|| panic!("no engine target in {}", doc["targets"]));
    assert_eq!(num(target, "ratio"), num(engine, "msg_rate_mpps"));
    let m = &doc["machine"];
    assert!(num(m, "cores") >= 1.0);
    assert!(m["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    assert_eq!(m["load_average"].as_array().map(Vec::len), Some(3));
    // The machine's hiccups, measured before anything else ran (0.2 s with --quick).
    let h = &m["hiccups"];
    assert!(
        num(h, "seconds") >= 0.2 && num(h, "per_second") >= 0.0,
        "{m}"
    );
    assert!(
        m["xdp_mode"]
            .as_str()
            .is_some_and(|x| x.starts_with("xdp-")),
        "{m}"
    );
    let mtus: Vec<u64> = doc["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mtu"].as_u64().unwrap())
        .collect();
    // The third pair, with 2 queues per end, is the threads section's.
    assert_eq!(mtus, vec![1500, 9000, 1500]);
    assert_eq!(doc["links"][2]["queues"], 2);

    let (ceiling, udp) = (&doc["ceiling"], &doc["udp"]);
    check_raw_section(ceiling, "ceiling");
    check_raw_section(udp, "udp");

    let x = &doc["xroce"];
    let bw = x["bw"].as_array().expect("xroce bw rows");
    for test in ["write_bw", "send_bw", "read_bw"] {
        assert!(bw.iter().any(|r| r["test"] == test), "no {test} row");
    }
    assert!(bw.iter().any(|r| r["qps"] == 16), "no row with many QPs");
    // The targets are this run's own ratios: write_bw 64 B against the ceiling is its row's.
    let targets = doc["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 12, "{targets:?}");
    let write_bw = bw
        .iter()
        .find(|r| {
            r["test"] == "write_bw" && r["size"] == 64 && r["qps"] == 1 && r["link_mtu"] == 1500
        })
        .expect("write_bw 64 B row");
    let target = targets
        .iter()
        .find(|t| t["name"] == "write_bw 64 B, 1 QP / raw AF_XDP stream")
        .expect("write_bw target");
    assert!(
        close(num(target, "ratio"), num(&write_bw["vs_ceiling"], "ratio")),
        "{target} vs {write_bw}"
    );
    assert_eq!(target["bound"], "at_least");
    for r in bw {
        let gbps = num(r, "gbps");
        assert!(gbps > 0.0 && num(r, "msg_rate_mpps") > 0.0, "{r}");
        let mtu = r["link_mtu"].as_u64().unwrap();
        let payload = r["size"]
            .as_u64()
            .unwrap()
            .min(r["path_mtu"].as_u64().unwrap());
        let dir = if r["test"] == "read_bw" {
            "B->A"
        } else {
            "A->B"
        };
        let c = num(stream(ceiling, mtu, payload, dir), "payload_gbps");
        let u = num(stream(udp, mtu, payload, dir), "payload_gbps");
        check_ratio(&r["vs_ceiling"], gbps, Some(c), &format!("{r}"));
        check_ratio(&r["vs_udp"], gbps, Some(u), &format!("{r}"));
    }
    let lat = x["lat"].as_array().expect("xroce lat rows");
    for test in ["send_lat", "write_lat", "read_lat"] {
        for size in [64u64, 4096] {
            assert!(
                lat.iter().any(|r| r["test"] == test && r["size"] == size),
                "no {test} {size}"
            );
        }
    }
    // The UC ping-pong (no ACK) beside RC's: its row, and the line that splits RC's time.
    assert!(
        lat.iter()
            .any(|r| r["test"] == "send_lat_uc" && r["size"] == 64 && r["mode"] == "busy-poll"),
        "no UC send_lat row"
    );
    for r in lat {
        let (med, p99) = (num(r, "median_us"), num(r, "p99_us"));
        assert!(med > 0.0 && p99 >= med, "{r}");
        let full = r["test"] == "read_lat";
        assert_eq!(
            r["measures"],
            if full {
                "round trip"
            } else {
                "half round trip"
            }
        );
        let (mtu, size) = (r["link_mtu"].as_u64().unwrap(), r["size"].as_u64().unwrap());
        let mode = r["mode"].as_str().unwrap();
        for (sec, key) in [(ceiling, "vs_ceiling"), (udp, "vs_udp")] {
            let p = ping(sec, mtu, size, mode);
            let (rm, rp) = if full {
                (num(p, "rtt_median_us"), num(p, "rtt_p99_us"))
            } else {
                (num(p, "half_rtt_median_us"), num(p, "half_rtt_p99_us"))
            };
            check_ratio(
                &r[key]["median"],
                med,
                Some(rm),
                &format!("{key} median {r}"),
            );
            check_ratio(&r[key]["p99"], p99, Some(rp), &format!("{key} p99 {r}"));
        }
    }

    let sc = &doc["scale"];
    let rows = sc["rows"].as_array().expect("scale rows");
    let qps: Vec<u64> = rows.iter().map(|r| r["qps"].as_u64().unwrap()).collect();
    assert_eq!(qps, vec![1, 16, 256, 1024]);
    let one = num(&rows[0], "gbps");
    for r in rows {
        let gbps = num(r, "gbps");
        assert!(gbps > 0.0 && num(r, "msg_rate_mpps") > 0.0, "{r}");
        check_ratio(&r["vs_one_qp"], gbps, Some(one), &format!("{r}"));
        let payload = r["size"].as_u64().unwrap().min(1024);
        let c = num(stream(ceiling, 1500, payload, "A->B"), "payload_gbps");
        check_ratio(&r["vs_ceiling"], gbps, Some(c), &format!("{r}"));
    }
    let mem = sc["memory"].as_array().expect("memory rows");
    assert_eq!(mem.len(), 4);
    let big = mem
        .iter()
        .find(|r| r["qps"] == 1024)
        .expect("1024-QP memory row");
    let (before, after) = (num(big, "rss_before_kib"), num(big, "rss_after_kib"));
    assert!(after > before, "{big}");
    assert!(
        close(num(big, "bytes_per_qp"), (after - before) * 1024.0 / 2048.0),
        "{big}"
    );
    assert!(sc["memory_method"]
        .as_str()
        .is_some_and(|s| s.contains("VmRSS")));
    check_threads_section(&doc["threads"]);
    let notes = doc["notes"].to_string();
    assert!(notes.contains("ratios"), "{notes}");
}

/// Every (test, threads, shards) row is there; each has a message rate with one figure per
/// client thread and its ratio to the one-thread row, or (with shards > 1 only, while the
/// device refuses them) the error that says so instead of figures.
fn check_threads_section(t: &Value) {
    assert_eq!(t["queues"], 2, "{t}");
    let rows = t["rows"].as_array().expect("threads rows");
    for test in ["write_bw", "send_bw"] {
        let one = rows
            .iter()
            .find(|r| r["test"] == test && r["threads"] == 1 && r["shards"] == 1)
            .unwrap_or_else(|| panic!("no {test} row with 1 thread: {t}"));
        let one_rate = num(one, "msg_rate_mpps");
        for (threads, shards) in [(1u64, 1u64), (2, 1), (2, 2)] {
            let r = rows
                .iter()
                .find(|r| r["test"] == test && r["threads"] == threads && r["shards"] == shards)
                .unwrap_or_else(|| panic!("no {test} --threads {threads} --shards {shards}: {t}"));
            assert_eq!(
                (r["size"].as_u64(), r["qps"].as_u64()),
                (Some(64), Some(2)),
                "{r}"
            );
            assert!(r["error"].is_null(), "the row failed: {r}");
            let rate = num(r, "msg_rate_mpps");
            assert!(rate > 0.0 && num(r, "gbps") > 0.0, "{r}");
            let per = r["per_thread_mpps"].as_array().expect("per_thread_mpps");
            assert_eq!(per.len() as u64, threads, "{r}");
            assert!(
                per.iter().all(|p| p.as_f64().is_some_and(|p| p > 0.0)),
                "{r}"
            );
            check_ratio(&r["vs_one_thread"], rate, Some(one_rate), &format!("{r}"));
        }
    }
}

#[test]
fn threads_section_alone_prints_every_row() {
    if !privileged("threads_section_alone_prints_every_row") {
        return;
    }
    let out = xroce(&["bench", "--sections", "threads", "--quick", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xroce bench --sections threads failed:\n{stderr}\n{stdout}"
    );
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"));
    assert_eq!(
        doc["failures"].as_array().map(Vec::len),
        Some(0),
        "{}",
        doc["failures"]
    );
    assert_eq!(doc["sections"], serde_json::json!(["threads"]));
    assert!(doc["xroce"].is_null() && doc["scale"].is_null(), "{doc}");
    assert_eq!(doc["links"].as_array().map(Vec::len), Some(1));
    check_threads_section(&doc["threads"]);
    assert!(stderr.contains("== 5. Threads"), "{stderr}");
    // The table shows each row's figures or its error, and the notes say what 2 cores mean.
    assert!(
        stderr.contains("write_bw") && stderr.contains("send_bw"),
        "{stderr}"
    );
    let notes = doc["notes"].to_string();
    assert!(
        notes.contains("2 client threads and 2 server threads"),
        "{notes}"
    );
}

/// The engine section runs in the bench's own process with no namespace or link: alone, it
/// needs no root (run as nobody when the test has root).
#[test]
fn engine_section_alone_needs_no_root() {
    let args = ["bench", "--sections", "engine", "--quick", "--json"];
    let out = if xroce::netns::is_privileged() {
        as_nobody(&args).unwrap_or_else(|| {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr().lock(),
                "engine_section_alone_needs_no_root: setpriv cannot drop root here; running as root"
            );
            xroce(&args)
        })
    } else {
        xroce(&args)
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"));
    assert_eq!(doc["sections"], serde_json::json!(["engine"]));
    assert!(
        num(&doc["engine"], "msg_rate_mpps") > 0.0,
        "{}",
        doc["engine"]
    );
    let targets = doc["targets"].as_array().expect("targets");
    let measured: Vec<&str> = targets
        .iter()
        .filter(|t| !t["ratio"].is_null())
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(measured.len(), 1, "{measured:?}");
    assert!(measured[0].starts_with("engine alone"), "{measured:?}");
    assert!(stderr.contains("== 7. The engine alone"), "{stderr}");
}
