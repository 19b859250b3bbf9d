//! `tests/c/verbs_tutorial.c`, a verbs program written in C against `<infiniband/verbs.h>`:
//! compiled by the tests with the system's gcc and Debian's libibverbs-dev, and run either on
//! rdma-core's libibverbs (rxe, in the lab guests) or on xroce's, through a directory whose
//! `libibverbs.so.1` links to xroce's library, put first on `LD_LIBRARY_PATH`.
//!
//! Include with `#[path = "common/ctut.rs"] mod ctut;`.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The program's source.
pub fn source() -> PathBuf {
    crate::common::repo_root().join("tests/c/verbs_tutorial.c")
}

/// The line the program prints last when every step passed.
pub const ALL_PASSED: &str = "all steps passed";

/// The steps each side reports with `<step>: ok:` (the server and the client alike).
pub const STEPS: &[&str] = &[
    "resources",
    "exchange",
    "connect",
    "send",
    "write",
    "read",
    "atomics",
    "violation",
    "destroy",
];

/// What is missing to compile the program (gcc, or libibverbs-dev's header), if anything.
pub fn missing_toolchain() -> Option<String> {
    crate::common::missing_c_header("infiniband/verbs.h", "libibverbs-dev")
}

/// Compiles the program into `dir/verbs_tutorial` (C99, every warning an error, linked
/// against the system's libibverbs); panics with gcc's output if it does not compile.
pub fn compile(dir: &Path) -> PathBuf {
    compile_verbs_program(dir, &source(), "verbs_tutorial")
}

/// Compiles the C program `source` into `dir/name` as a user builds a verbs program (C99,
/// every warning an error, `-libverbs`); panics with gcc's output if it does not compile.
pub fn compile_verbs_program(dir: &Path, source: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let res = Command::new("gcc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-s", "-o"])
        .arg(&out)
        .arg(source)
        .arg("-libverbs")
        .output()
        .expect("cannot run gcc");
    assert!(
        res.status.success(),
        "gcc did not compile {}:\n{}{}",
        source.display(),
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

/// xroce's libibverbs.so.1 as cargo builds it: `libxroce_ibverbs.so` in the build directory of
/// the test (a build of the workspace's default members makes it).
pub fn xroce_library() -> Result<PathBuf, String> {
    let dir = crate::common::ensure_abi_libraries();
    let lib = dir.join("libxroce_ibverbs.so");
    if lib.exists() {
        return Ok(lib);
    }
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => String::new(),
        Some("release") => " --release".into(),
        Some(p) => format!(" --profile {p}"),
        None => String::new(),
    };
    Err(format!(
        "xroce's library {} is not built (cargo build -p xroce-ibverbs{profile})",
        lib.display()
    ))
}

/// Makes `dir/lib`: a private copy of xroce's library (the shared build directory may be
/// rebuilt while the test runs) and `libibverbs.so.1` linking to it. Returns `dir/lib`, the
/// directory to put first on `LD_LIBRARY_PATH`.
pub fn xroce_lib_dir(dir: &Path) -> Result<PathBuf, String> {
    let lib = xroce_library()?;
    let libdir = dir.join("lib");
    fs::create_dir_all(&libdir).map_err(|e| format!("{}: {e}", libdir.display()))?;
    let copy = libdir.join("libxroce_ibverbs.so");
    fs::copy(&lib, &copy).map_err(|e| format!("copying {}: {e}", lib.display()))?;
    let link = libdir.join("libibverbs.so.1");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink("libxroce_ibverbs.so", &link)
        .map_err(|e| format!("{}: {e}", link.display()))?;
    Ok(libdir)
}

/// [`xroce_lib_dir`], or `None` after a visible skip (a failure under `XROCE_CI=1`).
pub fn xroce_lib_dir_or_skip(test: &str, dir: &Path) -> Option<PathBuf> {
    match xroce_lib_dir(dir) {
        Ok(d) => Some(d),
        Err(why) if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") => {
            panic!("{test} cannot run in CI: {why}")
        }
        Err(why) => {
            crate::common::report_skip(test, &why);
            None
        }
    }
}

/// Asserts that with `libdir` first on `LD_LIBRARY_PATH` the dynamic loader resolves the
/// program's libibverbs.so.1 to xroce's (so a pass cannot come from rdma-core's library).
pub fn assert_loads_xroce(prog: &Path, libdir: &Path) {
    let out = Command::new("ldd")
        .arg(prog)
        .env("LD_LIBRARY_PATH", libdir)
        .output()
        .expect("cannot run ldd");
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "libibverbs.so.1 => {}",
        libdir.join("libibverbs.so.1").display()
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with(&want)),
        "with LD_LIBRARY_PATH={} the program does not load xroce's library:\n{text}{}",
        libdir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Problems with one side's output: a step without its `ok` line, or no final line.
pub fn check_output(role: &str, stdout: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for step in STEPS {
        let line = format!("verbs_tutorial {role}: {step}: ok:");
        if !stdout.lines().any(|l| l.starts_with(&line)) {
            problems.push(format!("the {role} printed no `{step}: ok` line"));
        }
    }
    if !stdout.contains(&format!("verbs_tutorial {role}: {ALL_PASSED}")) {
        problems.push(format!("the {role} did not print `{ALL_PASSED}`"));
    }
    problems
}
