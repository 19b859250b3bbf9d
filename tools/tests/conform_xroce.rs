//! `xroce conform` against xroce itself: the target agent runs pyverbs on xroce's
//! libibverbs.so.1 in one namespace (`xroce run`), the scripted peer sends its frames over
//! AF_XDP from the other, and the whole catalogue must come out as the committed
//! expectations file says (`tools/src/conform/expect/xroce.txt`). The HTML report, the JSON lines
//! and the per-case captures and ladder diagrams are checked too.
//!
//! Needs root and python3-pyverbs; under `XROCE_CI=1` a missing one fails, elsewhere it skips
//! visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{veth_pair, xroce_bin, xroce_run};

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn the_catalogue_against_xroce_matches_its_expectations() {
    let test = "the_catalogue_against_xroce_matches_its_expectations";
    if !common::privileged_or_skip(test) || !common::pyverbs_or_skip(test, "pyverbs.qp") {
        return;
    }
    common::ensure_abi_libraries();
    let link = veth_pair(68, 1500);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.py");
    std::fs::write(&script, xroce_tools::conform::AGENT_PY).unwrap();
    let socket = dir.path().join("agent.sock");
    let program: Vec<String> = [
        "/usr/bin/python3",
        script.to_str().unwrap(),
        "--device",
        &format!("xroce_{}", link.b_if),
        "--gid-index",
        "1",
        "--unix",
        socket.to_str().unwrap(),
        "--once",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent = xroce_run(&link.b, &link.b_if, &[], &program)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the agent");
    let until = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(Instant::now() < until, "the agent did not listen");
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("the agent exited ({status}) before it listened");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let html = dir.path().join("report.html");
    let captures = dir.path().join("captures");
    let out = link
        .a
        .command(xroce_bin())
        .args(["conform", "-d", &link.a_if, "--target", "xroce", "--json"])
        .arg("--html")
        .arg(&html)
        .arg("--captures")
        .arg(&captures)
        .arg(format!("unix:{}", socket.display()))
        .stdin(Stdio::null())
        .output()
        .expect("run xroce conform");
    common::child::stop(&mut agent);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    for line in stdout
        .lines()
        .filter(|l| l.contains("\"as_expected\":false") || l.contains("\"summary\":\"3"))
    {
        eprintln!("{line}");
    }
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("every stdout line is JSON"))
        .collect();
    let cases = &lines[..lines.len() - 1];
    let summary = &lines[lines.len() - 1];
    assert_eq!(
        cases.len(),
        xroce_tools::conform::catalogue().len(),
        "every case ran"
    );
    for c in cases {
        assert!(c["rule"].as_str().unwrap().starts_with("IBTA "), "{c}");
        assert!(!c["checks"].as_array().unwrap().is_empty(), "{c}");
        assert_eq!(c["as_expected"], true, "{}: {c}", c["name"]);
    }
    assert_eq!(summary["differ"], serde_json::json!([]), "{summary}");
    // Each drop is counted under its reason in xroce's counters (the agent reads them with
    // xroce_read_counters through ctypes), and only there.
    for (case, counter) in [
        ("bad_icrc_dropped", "drops.bad_icrc"),
        ("wrong_pkey_dropped", "drops.bad_pkey"),
        ("wrong_dest_qp_dropped", "drops.unknown_qp"),
        ("wrong_source_dropped", "drops.bad_source_addr"),
        ("ud_qkey_violation", "drops.bad_qkey"),
    ] {
        let c = cases.iter().find(|c| c["name"] == case).expect(case);
        let m = c["measurements"].as_object().expect("measurements");
        assert_eq!(
            m.get(&format!("counter {counter}"))
                .and_then(|v| v.as_f64()),
            Some(1.0),
            "{case} counts one {counter}: {c}"
        );
    }

    assert!(out.status.success(), "exit status {}", out.status);

    let report = std::fs::read_to_string(&html).unwrap();
    for c in xroce_tools::conform::catalogue() {
        assert!(
            report.contains(&format!("id=\"{}\"", c.name)),
            "{} in the report",
            c.name
        );
        let pcap = captures.join(format!("{}.pcap", c.name));
        assert!(
            std::fs::metadata(&pcap).unwrap().len() > 24,
            "{} has frames",
            c.name
        );
        assert!(captures.join(format!("{}.svg", c.name)).exists());
    }
    assert!(report.matches("<svg").count() >= xroce_tools::conform::catalogue().len());
    // A case's capture decodes, every ICRC the peer and the target computed checks out
    // (bad_icrc_dropped's spoiled frame is the one bad one).
    let dump = std::process::Command::new(xroce_bin())
        .arg("dump")
        .arg(captures.join("read_success.pcap"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("RC_RDMA_READ_RESPONSE_LAST"), "{text}");
    assert!(text.contains("ICRC bad:           0"), "{text}");
}
