//! A build without the `xdp` feature (`cargo test --no-default-features --test
//! cli_without_xdp`, as scripts/test.sh runs it): what needs AF_XDP says that the feature is
//! missing, and what does not need it still works. With the feature this file is empty.
#![cfg(not(feature = "xdp"))]

use std::process::{Command, Output};

use xroce::driver::DriverError;
use xroce::verbs::{Device, DeviceConfig, DriverKind, VerbsError};

const NOT_BUILT: &str = "xroce was built without the `xdp` feature";

fn xroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xroce"))
        .args(args)
        .output()
        .expect("running xroce")
}

fn assert_refused_for_missing_xdp(args: &[&str]) {
    let out = xroce(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "xroce {args:?} succeeded");
    assert!(stderr.contains(NOT_BUILT), "xroce {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "xroce {args:?}: {stderr}");
}

#[test]
fn opening_an_af_xdp_device_is_a_typed_error() {
    let config = DeviceConfig {
        driver: DriverKind::Xdp,
        ..DeviceConfig::default()
    };
    match Device::open("lo", config) {
        Err(VerbsError::Driver(e @ DriverError::XdpNotBuilt)) => {
            assert!(e.to_string().contains(NOT_BUILT), "{e}");
            assert!(e.to_string().contains("--driver udp"), "{e}");
        }
        Err(other) => panic!("expected XdpNotBuilt, got {other}"),
        Ok(_) => panic!("an AF_XDP device opened without the xdp feature"),
    }
}

#[test]
fn tools_asked_for_af_xdp_say_the_feature_is_missing() {
    // The tools' default driver is xdp; each fails when it opens its device, before any
    // network exchange.
    assert_refused_for_missing_xdp(&["pingpong", "-d", "lo"]);
    assert_refused_for_missing_xdp(&["perf", "send_bw", "-d", "lo"]);
    assert_refused_for_missing_xdp(&["demo", "--driver", "xdp"]);
}

#[test]
fn demo_sim_and_dump_work_without_af_xdp() {
    let out = xroce(&["demo", "--driver", "sim"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = xroce(&["sim", "--ops", "200", "--loss", "0.05"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/rxe_rc_pingpong.pcap"
    );
    let out = xroce(&["dump", fixture]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_udp_driver_works_without_af_xdp() {
    let out = xroce(&["demo", "--driver", "udp"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // devinfo names the missing driver instead of offering it.
    let out = xroce(&["devinfo", "-d", "lo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("xdp (not in this build"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_sections_that_need_af_xdp_say_the_feature_is_missing() {
    // bench checks for root first (it makes namespaces); CI runs as root.
    if xroce::netns::is_privileged() {
        assert_refused_for_missing_xdp(&["bench", "--quick"]);
        assert_refused_for_missing_xdp(&["bench", "--quick", "--sections", "threads"]);
    } else {
        let out = xroce(&["bench", "--quick"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "bench succeeded without root");
        assert!(stderr.contains("needs root"), "{stderr}");
        eprintln!("SKIPPED (not root): the bench refusal without the xdp feature");
    }
}
