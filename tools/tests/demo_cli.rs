//! `xroce demo` runs in the suite: over the in-memory link, over kernel UDP sockets on
//! loopback, and (as root; CI is root) over AF_XDP between two network namespaces.
use std::process::Command;

fn demo(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xroce"))
        .arg("demo")
        .args(args)
        .output()
        .expect("running xroce demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- xroce demo {args:?} stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    (out.status.success(), stdout)
}

fn assert_all_verified(stdout: &str) {
    for op in [
        "SEND:",
        "SEND_WITH_IMM:",
        "RDMA_WRITE:",
        "RDMA_WRITE_WITH_IMM:",
        "RDMA_READ:",
        "FETCH_ADD:",
        "CMP_SWAP:",
    ] {
        assert!(stdout.contains(op), "no {op} step in the output");
    }
    assert_eq!(
        stdout.matches("  ✓ completed").count(),
        7,
        "7 verified client steps"
    );
    assert_eq!(
        stdout.matches("server check: ✓").count(),
        6,
        "6 verified server checks"
    );
    assert!(!stdout.contains('✗'));
    assert!(stdout.contains("All operations verified"));
    assert!(stdout.contains("Packet trace"));
    assert!(stdout.contains("RC_RDMA_READ_RESPONSE_FIRST"));
    assert!(stdout.contains("RC_ATOMIC_ACKNOWLEDGE"));
    // Frames the engine could not emit are counted and shown (none in a healthy run).
    assert!(stdout.contains(" emit_failed 0;"), "{stdout}");
}

#[test]
fn demo_over_the_in_memory_link() {
    let (ok, stdout) = demo(&["--driver", "sim"]);
    assert!(ok, "xroce demo --driver sim failed");
    assert_all_verified(&stdout);
}

#[test]
fn demo_over_udp_on_loopback() {
    let (ok, stdout) = demo(&["--driver", "udp", "--size", "20000"]);
    assert!(ok, "xroce demo --driver udp failed");
    assert_all_verified(&stdout);
    assert!(stdout.contains("driver udp"));
}

fn privileged(test: &str) -> bool {
    match xroce::netns::require_privileges(test) {
        Ok(go) => go,
        Err(msg) => panic!("{msg}"),
    }
}

fn namespaces() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn created_namespaces(stdout: &str) -> Vec<String> {
    stdout
        .split_whitespace()
        .filter(|w| w.starts_with("xroce-"))
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '-')
                .to_string()
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn demo_over_af_xdp_between_namespaces() {
    if !privileged("demo_over_af_xdp_between_namespaces") {
        return;
    }
    let (ok, stdout) = demo(&["--driver", "xdp"]);
    assert!(ok, "xroce demo --driver xdp failed");
    assert_all_verified(&stdout);
    assert!(stdout.contains("driver xdp-"), "the client ran on AF_XDP");
    assert!(stdout.contains("path MTU 1024"));
    assert!(stdout.contains("RoCE frames redirected to AF_XDP"));
    let created = created_namespaces(&stdout);
    assert!(
        !created.is_empty(),
        "the demo names the namespaces it created"
    );
    let left = namespaces();
    for ns in created {
        assert!(!left.contains(&ns), "namespace {ns} left behind");
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn demo_over_af_xdp_with_a_9000_byte_link() {
    if !privileged("demo_over_af_xdp_with_a_9000_byte_link") {
        return;
    }
    let (ok, stdout) = demo(&["--driver", "xdp", "--mtu", "9000", "--size", "100000"]);
    assert!(ok, "xroce demo --driver xdp --mtu 9000 failed");
    assert_all_verified(&stdout);
    assert!(stdout.contains("path MTU 4096"));
}

#[test]
fn demo_rejects_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_xroce"))
        .args(["demo", "--driver", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_xroce"))
        .args(["demo", "--mtu", "100"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mtu"));
}
