//! What the engines people scale with (UCX, libfabric, Open MPI, MPICH) expect of a
//! libibverbs device, beyond the verbs themselves: `tests/c/engine_conventions.c`, compiled
//! here against Debian's libibverbs-dev, runs on xroce's library over one end of a veth pair
//! (AF_XDP), at MTU 1500 (active MTU 1024) and at MTU 9000 (active MTU 4096). Each check is a
//! difference found when those engines ran on xroce, held to what rdma-core with rxe and mlx5
//! does:
//!
//! - `/dev/infiniband/<dev_name>` is a read/write character device (UCX skips a device
//!   without one);
//! - a completion channel's fd starts blocking, and with `O_NONBLOCK` `ibv_get_cq_event` and
//!   `ibv_get_async_event` return EAGAIN (UCX and libfabric drain until EAGAIN);
//! - `async_fd` stays the file a program registered with epoll before the device opened;
//! - a flow label of `~0` (UCX's) is taken in `ibv_create_ah` and in modify to RTR;
//! - `max_cqe` is as deep as libfabric's rxm asks (262,144);
//! - `IBV_ACCESS_HUGETLB` with on-demand paging is a hint, not an error;
//! - a QP with no receive queue can be made;
//! - an RC path MTU above the port's active MTU is refused with EINVAL;
//! - `max_inline_data` is rounded up to the room the QP has, and that much is accepted;
//! - a UD message may be as large as the port's active MTU (4096 at MTU 9000);
//! - a refused size probe prints nothing on stderr (rdma-core prints nothing; real refusals
//!   still say why, see docs/ibverbs.md).
//!
//! Needs root (namespaces, AF_XDP), gcc and libibverbs-dev: under `XROCE_CI=1` a missing one
//! fails the test, elsewhere it prints a SKIPPED line.

mod common;
#[path = "common/ctut.rs"]
mod ctut;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::child::{printed, wait};
use xroce::netns::{LinkConfig, VethLink};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/engine_conventions.c");

/// The checks every run must pass.
const ALWAYS: [&str; 15] = [
    "device_node",
    "channel_fd_starts_blocking",
    "cq_event_nonblocking_eagain",
    "async_event_nonblocking_eagain",
    "max_cqe_as_deep_as_rxm_asks",
    "deep_cq_created",
    "odp_hugetlb_mr",
    "ah_flow_label_all_ones",
    "inline_probe_refused",
    "qp_without_receive_queue",
    "rtr_flow_label_all_ones",
    "inline_rounded_up",
    "inline_as_reported_accepted",
    "ud_message_of_port_mtu",
    "async_fd_stays_the_same_file",
];

fn ci() -> bool {
    std::env::var("XROCE_CI").is_ok_and(|v| v == "1")
}

/// Runs the program on one veth end of a link with `mtu`; returns the problems found.
fn run_at_mtu(prog: &Path, libdir: &Path, mtu: u32) -> Vec<String> {
    let link = VethLink::create(&LinkConfig {
        mtu,
        ..LinkConfig::default()
    })
    .expect("namespaces and veth pair");
    let device = format!("xroce_{}", link.a_if);
    let child = link
        .a
        .command(prog)
        .arg(&device)
        .env("LD_LIBRARY_PATH", libdir)
        .env("XROCE_NETDEV", &link.a_if)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start engine_conventions");
    let out = wait(
        child,
        Instant::now() + Duration::from_secs(60),
        "the program",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut wanted: Vec<&str> = ALWAYS.to_vec();
    if mtu < 4096 + 80 {
        wanted.push("path_mtu_above_port_refused");
    }
    let mut problems: Vec<String> = wanted
        .iter()
        .filter(|name| !stdout.lines().any(|l| l == format!("ok {name}")))
        .map(|name| format!("MTU {mtu}: check {name} did not pass"))
        .collect();
    if !out.status.success() {
        problems.push(format!("MTU {mtu}: the program exited with {}", out.status));
    }
    // Real refusals say why (the path MTU's does); a size probe's refusal says nothing.
    if stderr.contains("max_inline_data") {
        problems.push(format!(
            "MTU {mtu}: the library printed the refused size probe"
        ));
    }
    if !problems.is_empty() {
        problems.push(printed(&out));
    }
    problems
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn a_device_is_what_ucx_libfabric_and_mpi_expect() {
    const TEST: &str = "a_device_is_what_ucx_libfabric_and_mpi_expect";
    if !common::privileged_or_skip(TEST) {
        return;
    }
    if let Some(why) = ctut::missing_toolchain() {
        assert!(!ci(), "{TEST} cannot run in CI: {why}");
        common::report_skip(TEST, &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = ctut::compile_verbs_program(dir.path(), Path::new(SOURCE), "engine_conventions");
    let Some(libdir) = ctut::xroce_lib_dir_or_skip(TEST, dir.path()) else {
        return;
    };
    ctut::assert_loads_xroce(&prog, &libdir);
    let mut problems = run_at_mtu(&prog, &libdir, 1500);
    problems.extend(run_at_mtu(&prog, &libdir, 9000));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
