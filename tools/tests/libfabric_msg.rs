//! libfabric's verbs provider FI_EP_MSG endpoints, unmodified, on xroce's `libibverbs.so.1` and
//! `librdmacm.so.1`, both sides, between two network namespaces joined by a veth pair, over
//! AF_XDP (issue 28).
//!
//! `fi_pingpong -e msg` cannot show it: its server hands its client the address its passive
//! endpoint is bound to, which is 127.0.0.1 when it asks without a node (on any stack), so the
//! client resolves a loopback address. So the project has a libfabric program of its own,
//! `tests/engines/fi_msg_check.c`, built here with gcc against Debian's libfabric-dev
//! (1.17) with every warning an error: a passive endpoint and `fi_listen`, FI_CONNREQ,
//! `fi_accept`, FI_CONNECTED on an event queue, then 100 ping-pongs of 1 KiB, a 64 KiB
//! `fi_read`/`fi_write`/`fi_read` of the server's registered buffer with keys exchanged in
//! messages, a 1 MiB `fi_send` waited for with `fi_cq_sread` (the completion channel), every
//! byte checked, and `fi_shutdown` with FI_SHUTDOWN on both sides. It runs twice: the server's
//! `fi_getinfo` given its own address (`-b`), and given no node (what fi_pingpong does: the
//! verbs provider binds to 127.0.0.1, which xroce's CM, as Linux's rdma_cm, lets hear REQs for
//! its port on every address).
//!
//! Each run has a deadline (a hang fails it). Needs root, gcc and libfabric-dev; under
//! `XROCE_CI=1` a missing one fails, elsewhere the test skips visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::child::{stop, wait_or_stop};
use common::{veth_pair, xroce_run};
use xroce::netns::VethLink;

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/engines/fi_msg_check.c"
);

fn skip_or_fail(test: &str, why: &str) {
    if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
        panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
    }
    common::report_skip(test, why);
}

/// What is missing to build the program: gcc, or libfabric-dev's header.
fn missing_toolchain() -> Option<String> {
    common::missing_c_header("rdma/fabric.h", "libfabric-dev")
}

/// Builds `fi_msg_check` into `dir`; `Err` with gcc's output if it does not compile.
fn compile(dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("fi_msg_check");
    let res = Command::new("gcc")
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(SOURCE)
        .arg("-lfabric")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run gcc: {e}"))?;
    if !res.status.success() {
        return Err(format!(
            "gcc did not compile {SOURCE}:\n{}{}",
            String::from_utf8_lossy(&res.stdout),
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    Ok(out)
}

/// One run: the server in A (bound to `bind`, or to no node), then the client in B once the
/// server printed that it listens. `Ok` with both sides' `ok` lines.
fn run_pair(
    link: &VethLink,
    prog: &Path,
    bind: Option<&str>,
    port: u16,
    secs: u64,
) -> Result<String, String> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let prog = prog.display().to_string();
    let port = port.to_string();
    let mut server = vec![prog.clone(), "-s".into(), "-p".into(), port.clone()];
    if let Some(addr) = bind {
        server.extend(["-b".into(), addr.to_string()]);
    }
    server.extend(["-t".into(), "30".into()]);
    let client = vec![
        prog,
        "-c".into(),
        link.a_ip.to_string(),
        "-p".into(),
        port,
        "-t".into(),
        "30".into(),
    ];
    let mut server_child = xroce_run(&link.a, &link.a_if, &[], &server)
        .spawn()
        .expect("spawn xroce run (server)");
    // The server's stdout, line by line, until it says it listens; the rest is kept.
    let stdout = server_child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut listening = false;
    while !listening && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => listening = line.contains("listening on port"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let server_text = |child: std::process::Child, reader: std::thread::JoinHandle<String>| {
        let out = match wait_or_stop(child, deadline + Duration::from_secs(5)) {
            Ok(o) => (o.status.success(), o),
            Err(o) => (false, o),
        };
        let text = format!(
            "{}{}",
            reader.join().unwrap_or_default(),
            String::from_utf8_lossy(&out.1.stderr)
        );
        (out.0, format!("exit {}:\n{text}", out.1.status))
    };
    if !listening {
        stop(&mut server_child);
        let (_, text) = server_text(server_child, reader);
        return Err(format!("the server never listened:\n{text}"));
    }
    let client_child = xroce_run(&link.b, &link.b_if, &[], &client)
        .spawn()
        .expect("spawn xroce run (client)");
    let c_out = wait_or_stop(client_child, deadline);
    if c_out.is_err() {
        // The server is waiting for a client that is gone.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&server_child),
            rustix::process::Signal::TERM,
        );
    }
    let (s_ok, s_text) = server_text(server_child, reader);
    let (c_ok, c_text) = match &c_out {
        Ok(o) => (
            o.status.success(),
            format!("exit {}:\n{}", o.status, common::child::printed(o)),
        ),
        Err(o) => (
            false,
            format!(
                "stopped at the deadline ({secs} s):\n{}",
                common::child::printed(o)
            ),
        ),
    };
    let took = started.elapsed().as_secs_f64();
    let ok_line = |text: &str, role: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("fi_msg_check ok role={role} ")))
            .map(str::to_string)
    };
    match (
        s_ok.then(|| ok_line(&s_text, "server")).flatten(),
        c_ok.then(|| ok_line(&c_text, "client")).flatten(),
    ) {
        (Some(s), Some(c)) if s.contains("big=fi_send") && c.contains("big=fi_send") => {
            Ok(format!("{took:.1} s\n  {s}\n  {c}"))
        }
        _ => Err(format!(
            "after {took:.1} s\n--- server {server:?}: {s_text}\n--- client {client:?}: {c_text}"
        )),
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn libfabric_msg_endpoints_on_xroce() {
    let test = "libfabric_msg_endpoints_on_xroce";
    if !common::privileged_or_skip(test) {
        return;
    }
    if let Some(why) = missing_toolchain() {
        skip_or_fail(test, &why);
        return;
    }
    common::ensure_abi_libraries();
    let dir = std::env::temp_dir().join(xroce::netns::unique_name("xroce-fimsg-"));
    std::fs::create_dir_all(&dir).expect("make a scratch directory");
    let built = compile(&dir);
    let prog = match built {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("{test}: {e}");
        }
    };
    let link = veth_pair(69, 1500);
    let a = link.a_ip.to_string();
    let cases: [(&str, Option<&str>, u16); 2] = [
        (
            "server fi_getinfo node = its own address (-b)",
            Some(&a),
            47593,
        ),
        (
            "server fi_getinfo node = NULL (fi_pingpong's way)",
            None,
            47594,
        ),
    ];
    let mut failed = Vec::new();
    for (label, bind, port) in cases {
        match run_pair(&link, &prog, bind, port, 60) {
            Ok(summary) => eprintln!("ok   {label}: {summary}"),
            Err(e) => {
                eprintln!("FAIL {label}: {e}");
                failed.push(format!("=== {label}\n{e}"));
            }
        }
    }
    drop(link);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.is_empty(),
        "{test}: {} of 2 runs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
