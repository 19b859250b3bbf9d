//! `xroce conform`'s command line without a target: the catalogue listing, the shipped agent,
//! and clear errors for what cannot run (no case selected, unknown expectations, no agent).
#[path = "../../tests/common/mod.rs"]
mod common;

use common::xroce_bin;

fn conform(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(xroce_bin())
        .arg("conform")
        .args(args)
        .output()
        .expect("run xroce conform");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn list_shows_every_case_with_its_rule() {
    let (ok, out, _) = conform(&["--list"]);
    assert!(ok);
    let cases = xroce_tools::conform::catalogue();
    assert_eq!(out.lines().count(), 2 * cases.len());
    for c in &cases {
        assert!(out.contains(c.name) && out.contains(c.rule), "{}", c.name);
    }
    let (ok, out, _) = conform(&["--list", "--cases", "duplicate"]);
    assert!(ok);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("duplicate_")).count(),
        4
    );
}

#[test]
fn print_agent_writes_the_shipped_agent() {
    let (ok, out, _) = conform(&["--print-agent"]);
    assert!(ok);
    assert_eq!(out, xroce_tools::conform::AGENT_PY);
}

#[test]
fn what_cannot_run_is_a_clear_error() {
    let (ok, _, err) = conform(&["--cases", "no_such_case", "unix:/nonexistent"]);
    assert!(!ok);
    assert!(err.contains("selects no case"), "{err}");
    let (ok, _, err) = conform(&["--target", "/no/such/expectations", "unix:/nonexistent"]);
    assert!(!ok);
    assert!(
        err.contains("neither rxe, xroce nor a readable file"),
        "{err}"
    );
    let (ok, _, err) = conform(&["unix:/nonexistent/agent.sock"]);
    assert!(!ok);
    assert!(
        err.contains("the target agent at unix:/nonexistent/agent.sock"),
        "{err}"
    );
    let (ok, _, err) = conform(&[]);
    assert!(!ok);
    assert!(err.contains("AGENT_ADDRESS"), "{err}");
    let (ok, _, err) = conform(&["--answer-ms", "0", "unix:/x"]);
    assert!(!ok);
    assert!(err.contains("answer-ms"), "{err}");
}
