//! The `xroce` command with bad input and a closed stdout: every check here runs before any
//! device is opened, so no root is needed.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

fn xroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xroce"))
}

/// A pipe's write end whose read end is already closed: every write to it fails with EPIPE
/// (the read end went to a `true` process that has exited).
fn closed_pipe() -> Stdio {
    let mut sink = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawning true");
    let write_end = sink.stdin.take().expect("piped stdin");
    sink.wait().expect("waiting for true");
    Stdio::from(write_end)
}

fn run_into_closed_pipe(args: &[&str]) -> Output {
    xroce()
        .args(args)
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .expect("running xroce")
}

fn assert_quiet_sigpipe_exit(args: &[&str]) {
    let out = run_into_closed_pipe(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "xroce {args:?} into a closed pipe wrote to stderr: {stderr}"
    );
    assert!(
        stderr.is_empty(),
        "xroce {args:?}: expected a quiet exit, stderr: {stderr}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "xroce {args:?} should end by SIGPIPE as the C tools do, got {:?}",
        out.status
    );
}

#[test]
fn closed_stdout_ends_sim_trace_quietly() {
    assert_quiet_sigpipe_exit(&["sim", "--ops", "2000", "--trace"]);
}

#[test]
fn closed_stdout_ends_demo_quietly() {
    assert_quiet_sigpipe_exit(&["demo", "--driver", "sim"]);
}

#[test]
fn closed_stdout_ends_devinfo_quietly() {
    assert_quiet_sigpipe_exit(&["devinfo", "-d", "lo", "-v"]);
}

#[test]
fn head_reading_two_lines_ends_sim_quietly() {
    // What `xroce sim --trace | head -2` does: read two lines, then close the pipe.
    use std::io::{BufRead, BufReader};
    let mut child = xroce()
        .args(["sim", "--ops", "2000", "--trace"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running xroce sim");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        lines.next().expect("a line").expect("readable");
    }
    drop(lines);
    let out = child.wait_with_output().expect("waiting for xroce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "stderr: {stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}",
        out.status
    );
}

/// `xroce args` fails quickly, before opening anything, with an error that names `flag`.
fn assert_refused(args: &[&str], flag: &str) {
    let start = std::time::Instant::now();
    let mut cmd = xroce();
    cmd.args(args);
    // A check that is missed must not open a real interface (and wait there for a peer):
    // name one that does not exist, so a missed check fails fast with another message.
    if !args.contains(&"-d") && matches!(args[0], "perf" | "pingpong" | "file" | "mr-check") {
        cmd.args(["-d", "xrnosuchif0"]);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running xroce");
    while child.try_wait().expect("waiting for xroce").is_none() {
        if start.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            panic!("xroce {args:?} still runs after 10 s: the value was accepted");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("xroce's output");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "xroce {args:?} was accepted: {stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "xroce {args:?}: {stderr}");
    assert!(
        stderr.contains(flag),
        "xroce {args:?}: the error must name {flag}: {stderr}"
    );
    for internal in [
        "max_mr_size",
        "cqe",
        "max_recv_wr",
        "max_send_wr",
        "panicked",
    ] {
        assert!(!stderr.contains(internal), "xroce {args:?}: {stderr}");
    }
    assert!(
        took < std::time::Duration::from_secs(5),
        "xroce {args:?} took {took:?}"
    );
}

#[test]
fn perf_counts_and_sizes_are_bounded() {
    // Was an abort allocating 80 GB of timestamps.
    assert_refused(
        &["perf", "read_lat", "-n", "10000000000"],
        "-n/--iters 10000000000",
    );
    assert_refused(
        &["perf", "write_bw", "-n", "10000000000"],
        "-n/--iters 10000000000",
    );
    assert_refused(&["perf", "write_bw", "-n", "4"], "-n/--iters 4");
    assert_refused(&["perf", "write_bw", "-s", "0"], "-s/--size 0");
    assert_refused(
        &["perf", "write_bw", "-s", "16777216"],
        "-s/--size 16777216",
    );
    assert_refused(&["perf", "write_bw", "-q", "0"], "-q/--qp 0");
    assert_refused(&["perf", "write_bw", "-q", "1025"], "-q/--qp 1025");
    // 1024 QPs fit the device; their buffers must fit the total too.
    assert_refused(
        &["perf", "write_bw", "-q", "1024", "-a"],
        "-q/--qp 1024 with messages of up to 8388608 bytes needs 16384 MiB",
    );
    assert_refused(&["perf", "write_bw", "-t", "0"], "-t/--tx-depth 0");
    assert_refused(&["perf", "write_bw", "-t", "20000"], "-t/--tx-depth 20000");
    assert_refused(&["perf", "write_bw", "-Q", "0"], "-Q/--cq-mod 0");
    assert_refused(&["perf", "write_bw", "-Q", "5000"], "-Q/--cq-mod 5000");
    assert_refused(&["perf", "send_bw", "-r", "100000"], "-r/--rx-depth 100000");
    assert_refused(&["perf", "read_bw", "-o", "0"], "-o/--outs 0");
    assert_refused(&["perf", "read_bw", "-o", "1000"], "-o/--outs 1000");
    assert_refused(&["perf", "write_bw", "-o", "4"], "-o/--outs");
    assert_refused(&["perf", "write_bw", "-I", "1000"], "-I/--inline_size 1000");
    assert_refused(&["perf", "read_lat", "-I", "64"], "-I/--inline_size");
    assert_refused(&["perf", "write_bw", "-H"], "-H/--report-histogram");
    assert_refused(&["perf", "send_bw", "-U"], "-U/--report-unsorted");
    assert_refused(
        &["perf", "write_bw", "-D", "100000"],
        "-D/--duration 100000",
    );
}

#[test]
fn perf_values_that_cannot_work_are_refused() {
    assert_refused(&["perf", "write_bw", "-D", "0"], "-D/--duration 0");
    // A random port nobody is told about.
    assert_refused(&["perf", "write_bw", "-p", "0"], "-p/--port 0");
    // No receive posted: every SEND waited 30 s.
    assert_refused(&["perf", "send_bw", "-r", "0"], "-r/--rx-depth 0");
}

#[test]
fn perf_threads_and_shards_are_bounded() {
    assert_refused(
        &["perf", "write_bw", "--threads", "0"],
        "--threads 0: must be between 1 and 64",
    );
    assert_refused(
        &["perf", "write_bw", "--threads", "65", "-q", "130"],
        "--threads 65: must be between 1 and 64",
    );
    // Each thread owns the same number of QPs.
    assert_refused(
        &["perf", "write_bw", "-q", "3", "--threads", "2"],
        "-q/--qp 3 is not a multiple of --threads 2",
    );
    assert_refused(
        &["perf", "send_bw", "--threads", "2"],
        "-q/--qp 1 is not a multiple of --threads 2",
    );
    // A latency test has one QP: more threads would measure nothing more.
    assert_refused(
        &["perf", "send_lat", "--threads", "2"],
        "--threads 2: a latency test runs one QP on one thread",
    );
    assert_refused(
        &["perf", "write_bw", "--shards", "0"],
        "--shards 0: must be between 1 and 64",
    );
    assert_refused(
        &["perf", "write_bw", "--shards", "65"],
        "--shards 65: must be between 1 and 64",
    );
    assert_refused(
        &["pingpong", "--shards", "0"],
        "--shards 0: must be between 1 and 64",
    );
}

/// A shard count the device refuses (the UDP driver has one socket, so one shard) is the
/// device's error, printed as one, never a panic.
#[test]
fn perf_prints_the_device_refusing_shards() {
    for args in [
        &[
            "perf", "write_bw", "--driver", "udp", "-d", "lo", "--shards", "2", "-p", "18793",
        ][..],
        &[
            "pingpong", "--driver", "udp", "-d", "lo", "--shards", "2", "-p", "18794",
        ],
    ] {
        let mut child = xroce()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running xroce");
        let start = std::time::Instant::now();
        while child.try_wait().expect("waiting for xroce").is_none() {
            if start.elapsed() > std::time::Duration::from_secs(5) {
                // The device took the shards and the tool waits for a peer: nothing refused.
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("xroce's output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(1) && !stderr.contains("shard") {
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "xroce {args:?}: {stderr}");
        assert!(
            stderr.contains("xroce: error:") && stderr.contains("shard"),
            "xroce {args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "xroce {args:?}: {stderr}");
    }
}

#[test]
fn pingpong_options_are_bounded() {
    // The SL is 4 bits.
    assert_refused(&["pingpong", "-l", "99"], "-l/--sl 99");
    assert_refused(&["pingpong", "-n", "0"], "-n/--iters 0");
    assert_refused(&["pingpong", "-n", "9999999999"], "-n/--iters 9999999999");
    assert_refused(&["pingpong", "-p", "0"], "-p/--port 0");
    assert_refused(&["pingpong", "-r", "1"], "-r/--rx-depth 1");
    // Was "max_recv_wr = 100000 exceeds the device limit" (and cqe) after opening the device.
    assert_refused(&["pingpong", "-r", "100000"], "-r/--rx-depth 100000");
    assert_refused(
        &["pingpong", "--uc", "-r", "100000"],
        "-r/--rx-depth 100000",
    );
    assert_refused(&["pingpong", "-s", "0"], "-s/--size 0");
    // Was "max_mr_size = ... exceeds the device limit".
    assert_refused(&["pingpong", "-s", "2000000000"], "-s/--size 2000000000");
}

/// `--driver` is parsed in the CLI from the library's driver names: a bad value gets clap's
/// message listing the names, `--help` lists each with its help line, and a good one passes.
#[test]
fn rping_options_are_checked_as_rpings() {
    // rping's own words (its usage and size range), before any device is opened.
    assert_refused(&["rping", "-v"], "give -s (server) or -c (client)");
    assert_refused(
        &["rping", "-s", "-S", "1"],
        "Invalid size 1 (valid range is 23 to 65536)",
    );
    assert_refused(&["rping", "-c", "-S", "65536"], "Invalid size 65536");
    assert_refused(
        &["rping", "-c", "-C", "3000000000"],
        "Invalid count 3000000000",
    );
    assert_refused(&["rping", "-c", "-C", "1"], "-a ADDR");
    assert_refused(
        &["rping", "-c", "-a", "no.such.host.invalid"],
        "invalid hostname or IP address",
    );
    assert_refused(
        &["rping", "-c", "-a", "198.18.0.9", "-D", "xrnosuchif0"],
        "xrnosuchif0",
    );
}

#[test]
fn driver_values_come_from_the_library() {
    for command in [
        &["pingpong"][..],
        &["perf", "write_bw"],
        &["file", "recv"],
        &["file", "send", "198.18.0.1", "x"],
        &["mr-check", "server"],
        &["mr-check", "client", "198.18.0.1"],
    ] {
        let out = xroce()
            .args(command)
            .args(["--driver", "nope"])
            .stdin(Stdio::null())
            .output()
            .expect("running xroce");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "xroce {command:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: invalid value 'nope' for '--driver <DRIVER>'\n  [possible values: xdp, udp, relay]\n"
            ),
            "xroce {command:?}: {stderr}"
        );
        let help = xroce()
            .args(command)
            .arg("--help")
            .output()
            .expect("running xroce --help");
        let help = String::from_utf8_lossy(&help.stdout);
        for line in [
            "- xdp:   AF_XDP (needs root / CAP_NET_ADMIN + CAP_BPF)",
            "- udp:   A kernel UDP socket on port 4791 (no privileges; the ICRC of received packets cannot be checked)",
            "- relay: Through the interface's `xroce relay` (several processes on one interface)",
            "[default: xdp]",
        ] {
            assert!(help.contains(line), "xroce {command:?} --help lacks {line:?}: {help}");
        }
    }
    // A good value is taken: the run gets as far as the interface (which does not exist).
    let out = xroce()
        .args(["pingpong", "--driver", "udp", "-d", "xrnosuchif0"])
        .stdin(Stdio::null())
        .output()
        .expect("running xroce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("-d xrnosuchif0"), "{stderr}");
}

/// The library takes no part in parsing the command line: clap is named only in `tools/src/cli`
/// and `tools/src/main.rs` (the library's types parse themselves with `FromStr`).
#[test]
fn clap_stays_in_the_cli() {
    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("reading src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {files:?}");
    let offenders: Vec<_> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("cli")) && **f != src.join("main.rs"))
        .filter(|f| std::fs::read_to_string(f).unwrap().contains("clap"))
        .collect();
    assert!(
        offenders.is_empty(),
        "clap named outside the CLI: {offenders:?}"
    );
}

#[test]
fn file_and_mr_check_options_are_bounded() {
    // 64 MiB x 1024 slots = 64 GiB: was a max_mr_size error naming no option.
    assert_refused(
        &["file", "recv", "--chunk", "67108864", "--slots", "1024"],
        "--chunk 67108864 x --slots 1024",
    );
    assert_refused(&["file", "recv", "--chunk", "0"], "--chunk 0");
    assert_refused(&["file", "recv", "--slots", "0"], "--slots 0");
    assert_refused(&["file", "recv", "-p", "0"], "-p/--port 0");
    assert_refused(
        &["file", "send", "198.18.0.1", "/etc/hostname", "-p", "0"],
        "-p/--port 0",
    );
    assert_refused(&["mr-check", "server", "--size", "0"], "--size 0");
    assert_refused(
        &["mr-check", "server", "--size", "2147483648"],
        "--size 2147483648",
    );
    assert_refused(
        &["mr-check", "client", "198.18.0.1", "--depth", "0"],
        "--depth 0",
    );
    assert_refused(
        &["mr-check", "client", "198.18.0.1", "--chunk", "0"],
        "--chunk 0",
    );
    // Was an overflow panic multiplying the Duration.
    assert_refused(
        &[
            "mr-check",
            "server",
            "--stall-timeout",
            "18446744073709551615",
        ],
        "--stall-timeout 18446744073709551615",
    );
    assert_refused(
        &["mr-check", "server", "--stall-timeout", "0"],
        "--stall-timeout 0",
    );
    assert_refused(&["mr-check", "server", "-p", "0"], "-p/--port 0");
}

#[test]
fn sim_operation_count_is_bounded() {
    assert_refused(&["sim", "--ops", "0"], "--ops 0");
    assert_refused(&["sim", "--ops", "100000000000"], "--ops 100000000000");
}

fn sim(args: &[&str]) -> (Option<i32>, String) {
    let out = xroce()
        .arg("sim")
        .args(args)
        .output()
        .expect("running xroce sim");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A failure scenario whose operations failed as it should reads as that, not "result: OK";
/// one that never took effect tested nothing and fails.
#[test]
fn sim_result_line_says_what_happened() {
    let (code, out) = sim(&["--no-recv", "--ops", "50"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("result: OK"), "{out}");
    assert!(
        out.contains("result: EXPECTED FAILURE: ") && out.contains("as --no-recv makes them fail"),
        "{out}"
    );
    let (code, out) = sim(&["--wrong-rkey", "100000", "--ops", "50"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("result: FAILED: the scenario --wrong-rkey 100000 never took effect"),
        "{out}"
    );
    let (code, out) = sim(&["--ops", "50"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("result: OK: all 50 operations completed and verified"),
        "{out}"
    );
}

/// A veth whose peer is down is up but has no carrier: the tools say that, not "not up"
/// (whose advice, `ip link set ... up`, was already done). Needs root for the namespace.
#[test]
fn interface_without_carrier_is_reported_as_such() {
    if !common::privileged_or_skip("interface_without_carrier_is_reported_as_such") {
        return;
    }
    let ns = xroce::netns::Netns::create("toolopts").expect("namespace");
    ns.ip(&[
        "link", "add", "tovA", "type", "veth", "peer", "name", "tovB",
    ])
    .expect("veth pair");
    ns.ip(&["addr", "add", "198.18.77.1/24", "dev", "tovA"])
        .unwrap();
    ns.ip(&["link", "set", "tovA", "up"]).unwrap();
    let out = ns
        .command(env!("CARGO_BIN_EXE_xroce"))
        .args(["pingpong", "-d", "tovA", "--driver", "udp"])
        .output()
        .expect("running xroce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("interface tovA is up but has no carrier")
            && stderr.contains("bring its peer up"),
        "{stderr}"
    );
    assert!(!stderr.contains("not up"), "{stderr}");
}

/// A server whose client connects and dies: the error says the peer closed the connection,
/// prints its cause once, and does not ask whether the peer runs the same test. No root:
/// the UDP driver on lo.
#[test]
fn server_whose_client_died_says_so_once() {
    use std::io::Read;
    for (tool, port) in [("perf", "18791"), ("pingpong", "18792")] {
        let mut cmd = xroce();
        match tool {
            "perf" => cmd.args(["perf", "write_bw"]),
            _ => cmd.arg("pingpong"),
        };
        let mut server = cmd
            .args(["-d", "lo", "--driver", "udp", "-p", port])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the server");
        let addr = format!("127.0.0.1:{port}");
        let start = std::time::Instant::now();
        let stream = loop {
            match std::net::TcpStream::connect(&addr) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < std::time::Duration::from_secs(20) => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("{tool} server never listened: {e}"),
            }
        };
        drop(stream); // the client "dies"
        let status = server.wait().expect("server exits");
        let mut stderr = String::new();
        server
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(1), "{tool}: {stderr}");
        let line = stderr.lines().last().unwrap_or_default();
        assert!(line.starts_with("xroce: error: "), "{tool}: {stderr}");
        let cause = if tool == "perf" {
            "end of stream after 0 of 16 bytes"
        } else {
            "end of stream after 0 of 52 bytes"
        };
        assert_eq!(
            line.matches(cause).count(),
            1,
            "{tool}: the cause is printed once: {line}"
        );
        assert!(
            line.matches("closed the connection").count() <= 1,
            "{tool}: said twice: {line}"
        );
        if tool == "perf" {
            assert!(line.contains("the peer closed the connection"), "{line}");
            assert!(!line.contains("same test"), "{line}");
        }
    }
}
