//! A C verbs program on xroce's libibverbs.so.1: `tests/c/verbs_tutorial.c`, compiled here
//! with gcc against Debian's libibverbs-dev (C99, `-Wall -Wextra -Werror`), exactly as a
//! user would build a tutorial's program, then run unmodified with xroce's library first on
//! `LD_LIBRARY_PATH`: server in one namespace, client in another, over a veth pair. Its
//! script: SEND with immediate both ways (the receive waited for through a completion
//! channel), RDMA WRITE and READ checked byte for byte, fetch-and-add and compare-and-swap
//! with the old values checked, a WRITE with a wrong rkey that must complete with
//! `IBV_WC_REM_ACCESS_ERR` and leave the server's memory alone, and the teardown in order.
//! Against rxe the same program runs in `tools/tests/interop_rxe.rs` (`c_verbs_tutorial` cases).
//!
//! Needs gcc and libibverbs-dev (and root for the namespaces): under `XROCE_CI=1` a missing
//! one fails the test, elsewhere it prints a SKIPPED line.

mod common;
#[path = "common/ctut.rs"]
mod ctut;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::child::{printed, wait};
use xroce::netns::{LinkConfig, VethLink};

fn ci() -> bool {
    std::env::var("XROCE_CI").is_ok_and(|v| v == "1")
}

/// The compiled program in a temporary directory, or `None` after a visible skip.
fn compiled(test: &str, dir: &Path) -> Option<PathBuf> {
    if let Some(why) = ctut::missing_toolchain() {
        if ci() {
            panic!("{test} cannot run in CI: {why}");
        }
        common::report_skip(test, &why);
        return None;
    }
    Some(ctut::compile(dir))
}

/// The program compiles cleanly with every warning an error (no root needed).
#[test]
fn compiles_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compiled("compiles_without_warnings", dir.path()) else {
        return;
    };
    let meta = std::fs::metadata(&prog).expect("gcc wrote the program");
    assert!(meta.len() > 0);
}

/// A failing step is reported as such: on a machine without the device asked for, the
/// program names the step and exits 1 (whichever libibverbs it finds).
#[test]
fn a_failing_step_is_named_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compiled("a_failing_step_is_named_and_exits_1", dir.path()) else {
        return;
    };
    let out = Command::new(&prog)
        .args(["-d", "no_such_device_0", "-p", "1"])
        .env("XROCE_NETDEV", "lo")
        .output()
        .expect("run the program");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(
        err.contains("verbs_tutorial server: FAILED at resources: "),
        "no step named: {err}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(ctut::ALL_PASSED),
        "{}",
        printed(&out)
    );
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn both_sides_on_xroce_between_namespaces() {
    const TEST: &str = "both_sides_on_xroce_between_namespaces";
    if !common::privileged_or_skip(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compiled(TEST, dir.path()) else {
        return;
    };
    let Some(libdir) = ctut::xroce_lib_dir_or_skip(TEST, dir.path()) else {
        return;
    };
    ctut::assert_loads_xroce(&prog, &libdir);

    let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth pair");
    link.add_static_neighbours().expect("static neighbours");
    // Each side sees the one device of its interface, named as `xroce devinfo` names it;
    // GID index 1 is the interface's IPv4 address, as with rxe.
    let side = |ns: &xroce::netns::Netns, ifname: &str, server: Option<String>| {
        let mut cmd = ns.command(&prog);
        cmd.args(["-d", &format!("xroce_{ifname}"), "-g", "1", "-p", "18515"])
            .args(server)
            .env("LD_LIBRARY_PATH", &libdir)
            .env("XROCE_NETDEV", ifname)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().expect("start verbs_tutorial")
    };
    let server = side(&link.a, &link.a_if, None);
    // The client retries its TCP connect until the server listens.
    let client = side(&link.b, &link.b_if, Some(link.a_ip.to_string()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let c_out = wait(client, deadline, "the client");
    let s_out = wait(server, deadline + Duration::from_secs(5), "the server");
    let mut problems = Vec::new();
    if !c_out.status.success() {
        problems.push(format!("the client exited with {}", c_out.status));
    }
    if !s_out.status.success() {
        problems.push(format!("the server exited with {}", s_out.status));
    }
    problems.extend(ctut::check_output(
        "server",
        &String::from_utf8_lossy(&s_out.stdout),
    ));
    problems.extend(ctut::check_output(
        "client",
        &String::from_utf8_lossy(&c_out.stdout),
    ));
    assert!(
        problems.is_empty(),
        "{}\n--- server:\n{}\n--- client:\n{}",
        problems.join("\n"),
        printed(&s_out),
        printed(&c_out)
    );
}
