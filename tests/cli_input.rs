//! The `xroce` command with bad input and a closed stdout: every check here runs before any
//! device is opened, so no root is needed.
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
