//! The CLI's tracing subscriber: `RUST_LOG` events reach stderr, never stdout.
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("tests/fixtures")
        .join(name)
}

fn dump(rust_log: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xroce"));
    cmd.arg("dump")
        .args(args)
        .arg(fixture("rxe_rc_pingpong.pcap"));
    cmd.env_remove("RUST_LOG");
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    cmd.output().unwrap()
}

#[test]
fn rust_log_debug_reaches_stderr_and_leaves_stdout_alone() {
    let quiet = dump(None, &["--json"]);
    let loud = dump(Some("debug"), &["--json"]);
    assert!(quiet.status.success() && loud.status.success());
    let stderr = String::from_utf8(loud.stderr).unwrap();
    let line = stderr
        .lines()
        .find(|l| l.contains("capture opened"))
        .unwrap_or_else(|| panic!("no debug event on stderr:\n{stderr}"));
    assert!(
        line.contains("DEBUG") && line.contains("format=\"pcap\""),
        "{line}"
    );
    // stdout is the same JSON, line for line, with or without logging.
    assert_eq!(loud.stdout, quiet.stdout);
    for l in String::from_utf8(loud.stdout).unwrap().lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
}

#[test]
fn by_default_only_warnings_and_errors_are_shown() {
    let out = dump(None, &[]);
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stderr.contains("capture opened"), "{stderr}");
    // A filter that names only another target hides the event too.
    let out = dump(Some("netlink=debug"), &[]);
    assert!(!String::from_utf8(out.stderr)
        .unwrap()
        .contains("capture opened"));
}
