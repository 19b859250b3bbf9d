//! `--pcap FILE` of every tool: the frames the driver sends and receives, written by the
//! device itself (over AF_XDP tcpdump on the interface sees no RoCE frames), decoded back
//! with `xroce dump --json`: both directions are there and every ICRC is good.
//!
//! The AF_XDP pair needs root; under `XROCE_CI=1` a missing privilege fails, elsewhere it
//! skips visibly. The in-memory demo and the option checks need nothing.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::child::wait;
use xroce::netns::{LinkConfig, Netns, VethLink};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xroce-tools-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// One decoded RoCE frame of `xroce dump --json`.
struct Decoded {
    src: String,
    dst: String,
    icrc_ok: bool,
    opcode: String,
}

fn dump(path: &Path) -> Vec<Decoded> {
    let out = Command::new(common::xroce_bin())
        .args(["dump", "--json"])
        .arg(path)
        .output()
        .expect("run xroce dump");
    assert!(
        out.status.success(),
        "xroce dump {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            Decoded {
                src: v["src"].as_str().unwrap_or_default().to_string(),
                dst: v["dst"].as_str().unwrap_or_default().to_string(),
                icrc_ok: v["icrc_ok"].as_bool() == Some(true),
                opcode: v["opcode_name"].as_str().unwrap_or_default().to_string(),
            }
        })
        .collect()
}

/// Both directions between `a` and `b`, at least `min_each` frames each, all ICRCs good.
fn assert_both_directions(path: &Path, a: &str, b: &str, min_each: usize) {
    let frames = dump(path);
    let a_to_b = frames.iter().filter(|f| f.src == a && f.dst == b).count();
    let b_to_a = frames.iter().filter(|f| f.src == b && f.dst == a).count();
    let bad: Vec<&str> = frames
        .iter()
        .filter(|f| !f.icrc_ok)
        .map(|f| f.opcode.as_str())
        .collect();
    assert!(
        a_to_b >= min_each && b_to_a >= min_each,
        "{}: {a_to_b} frames {a}->{b}, {b_to_a} frames {b}->{a} of {} (want {min_each} each)",
        path.display(),
        frames.len()
    );
    assert!(bad.is_empty(), "{}: bad ICRC on {bad:?}", path.display());
}

fn spawn(ns: &Netns, args: &[String]) -> std::process::Child {
    ns.command(common::xroce_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xroce")
}

/// Server `tool` in A, client in B (A's address last), each with `--pcap`; both exit 0.
fn tool_pair(link: &VethLink, tool: &[&str], server_pcap: &Path, client_pcap: &Path) {
    let base: Vec<String> = tool.iter().map(|a| a.to_string()).collect();
    let mut s = base.clone();
    s.extend(["-d".into(), link.a_if.clone(), "--pcap".into()]);
    s.push(server_pcap.display().to_string());
    let mut c = base;
    c.extend(["-d".into(), link.b_if.clone(), "--pcap".into()]);
    c.push(client_pcap.display().to_string());
    c.push(link.a_ip.to_string());
    let server = spawn(&link.a, &s);
    let client = spawn(&link.b, &c);
    let deadline = Instant::now() + Duration::from_secs(60);
    let c_out = wait(client, deadline, "client");
    let s_out = wait(server, deadline + Duration::from_secs(5), "server");
    for (who, out) in [("client", &c_out), ("server", &s_out)] {
        assert!(
            out.status.success(),
            "{who} {tool:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn pingpong_and_perf_pairs_capture_both_directions_over_af_xdp() {
    if !common::privileged_or_skip("pingpong_and_perf_pairs_capture_both_directions_over_af_xdp") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .expect("namespaces and veth pair");
    let (a, b) = (link.a_ip.to_string(), link.b_ip.to_string());
    let (ps, pc) = (
        scratch("pingpong-server.pcap"),
        scratch("pingpong-client.pcap"),
    );
    tool_pair(
        &link,
        &["pingpong", "-g", "1", "-n", "50", "-s", "3000"],
        &ps,
        &pc,
    );
    // 50 exchanges of 3000 bytes (3 packets at path MTU 1024) each way, plus ACKs.
    assert_both_directions(&ps, &a, &b, 150);
    assert_both_directions(&pc, &a, &b, 150);
    let (rs, rc) = (scratch("read-server.pcap"), scratch("read-client.pcap"));
    tool_pair(
        &link,
        &["perf", "read_lat", "-n", "20", "-s", "64"],
        &rs,
        &rc,
    );
    assert_both_directions(&rs, &a, &b, 20);
    assert_both_directions(&rc, &a, &b, 20);
    let _ = std::fs::remove_dir_all(ps.parent().unwrap());
}

#[test]
fn demo_over_the_in_memory_link_captures_both_directions() {
    let path = scratch("demo-sim.pcap");
    let out = Command::new(common::xroce_bin())
        .args(["demo", "--driver", "sim", "--trace", "0", "--pcap"])
        .arg(&path)
        .output()
        .expect("run xroce demo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_both_directions(&path, "198.18.0.1", "198.18.0.2", 5);
    let _ = std::fs::remove_file(path);
}

#[test]
fn every_tool_offers_pcap_and_names_a_bad_path() {
    for tool in [
        &["pingpong"][..],
        &["perf", "send_bw"],
        &["file", "send", "h", "p"],
        &["file", "recv"],
        &["mr-check", "server"],
        &["demo"],
    ] {
        let out = Command::new(common::xroce_bin())
            .args(tool)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--pcap <FILE>"), "{tool:?} --help:\n{help}");
    }
    let out = Command::new(common::xroce_bin())
        .args([
            "demo",
            "--driver",
            "sim",
            "--trace",
            "0",
            "--pcap",
            "/nonexistent-xroce-dir/x.pcap",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("creating the capture file /nonexistent-xroce-dir/x.pcap"),
        "{text}"
    );
}
