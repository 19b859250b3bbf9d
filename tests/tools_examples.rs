//! The example programs run: each one's `demo` (both roles in one process over two
//! in-memory devices, no root), and with root, server and client as separate processes in
//! two namespaces over AF_XDP.
//!
//! The examples are built by `cargo build --all-targets` (which `scripts/test.sh` runs) or
//! `cargo test` without `--test`; a missing binary fails with that advice.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use xroce::netns::{LinkConfig, VethLink};

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/tools_examples-<hash> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the examples first (cargo build --examples, or --all-targets)",
        path.display()
    );
    path
}

fn finish(mut child: std::process::Child, secs: u64, what: &str) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} hung:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn example_demos_run_in_memory() {
    for (name, expect) in [
        ("send_recv", "demo: SEND/RECV both ways OK"),
        ("rdma_read_write", "demo: RDMA WRITE, READ and key check OK"),
        ("file_transfer", "demo: file transfer verified"),
    ] {
        let child = Command::new(example(name))
            .arg("demo")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = finish(child, 60, name);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(expect), "{name}: {text}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn examples_between_namespaces_over_af_xdp() {
    if !common::privileged_or_skip("examples_between_namespaces_over_af_xdp") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).unwrap();
    link.add_static_neighbours().unwrap();
    let host = link.a_ip.to_string();
    let dir = std::env::temp_dir().join(format!("xroce-examples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.bin");
    let data: Vec<u8> = (0..(3 << 20) + 5u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    let output = dir.join("out.bin");
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        (
            "send_recv",
            vec!["server".into()],
            vec!["client".into(), host.clone()],
        ),
        (
            "rdma_read_write",
            vec!["server".into()],
            vec!["client".into(), host.clone()],
        ),
        (
            "file_transfer",
            vec!["recv".into(), output.to_str().unwrap().into()],
            vec!["send".into(), host.clone(), input.to_str().unwrap().into()],
        ),
    ];
    for (name, server_args, client_args) in cases {
        let bin = example(name);
        let server = link
            .a
            .command(&bin)
            .args(&server_args)
            .args(["--dev", &link.a_if])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The examples do not retry: give the server time to open its device and listen.
        std::thread::sleep(Duration::from_millis(1500));
        let client = link
            .b
            .command(&bin)
            .args(&client_args[..1])
            .args(["--dev", &link.b_if])
            .args(&client_args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        finish(client, 60, &format!("{name} client"));
        finish(server, 10, &format!("{name} server"));
    }
    assert_eq!(std::fs::read(&output).unwrap(), data);
    std::fs::remove_dir_all(&dir).unwrap();
}
