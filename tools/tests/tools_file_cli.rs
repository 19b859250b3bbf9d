//! `xroce file send|recv` as a user runs it: each side its own process, the receiver in
//! namespace A and the sender in B (kernel UDP driver over a veth pair). What is checked is
//! what the user sees: exit codes, the messages, and which files are in the destination
//! directory afterwards (the final file, whole, and never a leftover temporary file).
//!
//! The transfers need root (namespaces); under `XROCE_CI=1` a missing privilege fails,
//! elsewhere those tests skip visibly. The checks of `-o` need nothing.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use xroce::netns::{LinkConfig, VethLink};

fn link() -> VethLink {
    let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth pair");
    link.add_static_neighbours().expect("static neighbours");
    link
}

/// A fresh directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "xroce-file-cli-{tag}-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    /// The names in the directory, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 9) as u8)
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits for a child with a deadline; kills it when the deadline passes.
fn wait(mut child: Child, deadline: Instant, what: &str) -> Output {
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!("{what} did not finish in time\n{}", text(&out));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn spawn(mut cmd: Command, cwd: &Path, args: &[String]) -> Child {
    cmd.current_dir(cwd)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xroce")
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// `xroce file recv ARGS` in A (cwd `cwd`), over the UDP driver.
fn receiver(link: &VethLink, cwd: &Path, args: &[&str]) -> Child {
    let mut a = strings(&["file", "recv"]);
    a.extend(strings(args));
    a.extend(strings(&["-d", &link.a_if, "--driver", "udp"]));
    spawn(link.a.command(common::xroce_bin()), cwd, &a)
}

/// `xroce file send A's-address FILE ARGS` in B.
fn sender(link: &VethLink, file: &Path, args: &[&str]) -> Child {
    let mut a = strings(&["file", "send", &link.a_ip.to_string()]);
    a.push(file.to_string_lossy().into_owned());
    a.extend(strings(args));
    a.extend(strings(&["-d", &link.b_if, "--driver", "udp"]));
    spawn(link.b.command(common::xroce_bin()), Path::new("/"), &a)
}

/// Runs one receiver and one sender to the end: (receiver, sender) output.
fn run_pair(
    link: &VethLink,
    cwd: &Path,
    recv_args: &[&str],
    file: &Path,
    send_args: &[&str],
) -> (Output, Output) {
    let r = receiver(link, cwd, recv_args);
    let s = sender(link, file, send_args);
    let deadline = Instant::now() + Duration::from_secs(60);
    let s_out = wait(s, deadline, "sender");
    let r_out = wait(r, deadline + Duration::from_secs(5), "receiver");
    (r_out, s_out)
}

fn is_leftover(name: &str) -> bool {
    name.starts_with(".xroce") || name.contains("partial")
}

#[test]
fn an_existing_destination_fails_at_the_sender_with_the_receivers_reason() {
    if !common::privileged_or_skip(
        "an_existing_destination_fails_at_the_sender_with_the_receivers_reason",
    ) {
        return;
    }
    let link = link();
    let (dst, src) = (Dir::new("exists-dst"), Dir::new("exists-src"));
    let old = b"the old content stays".to_vec();
    std::fs::write(dst.path().join("input.bin"), &old).unwrap();
    let file = src.path().join("input.bin");
    std::fs::write(&file, data((2 << 20) + 5, 1)).unwrap();
    // No -o: the sender's name, in the receiver's working directory, where it exists.
    let (r, s) = run_pair(
        &link,
        dst.path(),
        &["--chunk", "65536"],
        &file,
        &["--chunk", "65536"],
    );
    let (r_text, s_text) = (text(&r), text(&s));
    assert!(!s.status.success(), "sender must fail:\n{s_text}");
    assert!(!s_text.contains("verified SHA-256: OK"), "{s_text}");
    assert!(
        s_text.contains("input.bin exists") && s_text.contains("--force"),
        "the sender is told the receiver's reason:\n{s_text}"
    );
    assert!(!r.status.success(), "receiver:\n{r_text}");
    assert!(r_text.contains("input.bin exists"), "{r_text}");
    assert_eq!(std::fs::read(dst.path().join("input.bin")).unwrap(), old);
    assert_eq!(
        dst.names(),
        vec!["input.bin"],
        "nothing else is left behind"
    );
}

#[test]
fn output_naming_a_directory_receives_into_it_and_ok_means_the_file_is_there() {
    if !common::privileged_or_skip(
        "output_naming_a_directory_receives_into_it_and_ok_means_the_file_is_there",
    ) {
        return;
    }
    let link = link();
    let (dst, src) = (Dir::new("odir-dst"), Dir::new("odir-src"));
    let file = src.path().join("payload.bin");
    let bytes = data((3 << 20) + 77, 2);
    std::fs::write(&file, &bytes).unwrap();
    let out = dst.path().to_string_lossy().into_owned();
    let (r, s) = run_pair(&link, Path::new("/"), &["-o", &out], &file, &[]);
    assert!(
        s.status.success(),
        "sender:\n{}\nreceiver:\n{}",
        text(&s),
        text(&r)
    );
    assert!(r.status.success(), "receiver:\n{}", text(&r));
    assert!(
        text(&s).contains("receiver verified SHA-256: OK"),
        "{}",
        text(&s)
    );
    assert_eq!(dst.names(), vec!["payload.bin"]);
    assert!(std::fs::read(dst.path().join("payload.bin")).unwrap() == bytes);
}

#[test]
fn two_receivers_in_one_directory_each_get_their_own_file() {
    if !common::privileged_or_skip("two_receivers_in_one_directory_each_get_their_own_file") {
        return;
    }
    let (l1, l2) = (link(), link());
    let (dst, src) = (Dir::new("two-dst"), Dir::new("two-src"));
    let (f1, f2) = (src.path().join("one.bin"), src.path().join("two.bin"));
    let (d1, d2) = (data(6 << 20, 3), data(6 << 20, 4));
    std::fs::write(&f1, &d1).unwrap();
    std::fs::write(&f2, &d2).unwrap();
    // Both without -o, in the same working directory, at the same time.
    let args = ["--chunk", "16384", "--slots", "2"];
    let r1 = receiver(&l1, dst.path(), &args);
    let r2 = receiver(&l2, dst.path(), &args);
    let s1 = sender(&l1, &f1, &args);
    let s2 = sender(&l2, &f2, &args);
    let deadline = Instant::now() + Duration::from_secs(90);
    let outs = [
        wait(s1, deadline, "sender 1"),
        wait(s2, deadline, "sender 2"),
        wait(r1, deadline, "receiver 1"),
        wait(r2, deadline, "receiver 2"),
    ];
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    assert_eq!(dst.names(), vec!["one.bin", "two.bin"]);
    assert!(std::fs::read(dst.path().join("one.bin")).unwrap() == d1);
    assert!(std::fs::read(dst.path().join("two.bin")).unwrap() == d2);
}

/// Starts a slow transfer, waits until the receiver's temporary file has data, sends it
/// `signal`; returns the receiver's output and the directory's names afterwards.
fn signal_mid_transfer(signal: &str) -> (Output, Vec<String>) {
    let link = link();
    let (dst, src) = (Dir::new("sig-dst"), Dir::new("sig-src"));
    let file = src.path().join("big.bin");
    std::fs::write(&file, data(64 << 20, 5)).unwrap();
    // One 4 KiB chunk per round trip: slow enough to catch in the middle.
    let args = ["--chunk", "4096", "--slots", "1"];
    let r = receiver(&link, dst.path(), &args);
    let s = sender(&link, &file, &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    let partial = loop {
        let found = std::fs::read_dir(dst.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| e.metadata().map(|m| m.len() > 0).unwrap_or(false));
        if let Some(e) = found {
            break e.file_name().to_string_lossy().into_owned();
        }
        assert!(Instant::now() < deadline, "no data arrived within 30 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(partial.starts_with(".xroce"), "temporary name {partial:?}");
    let kill = Command::new("kill")
        .args([signal, &r.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let r_out = wait(r, Instant::now() + Duration::from_secs(10), "receiver");
    let s_out = wait(s, Instant::now() + Duration::from_secs(60), "sender");
    assert!(
        !s_out.status.success(),
        "the sender must fail:\n{}",
        text(&s_out)
    );
    (r_out, dst.names())
}

#[test]
fn sigterm_mid_transfer_removes_the_partial_file_and_exits_143() {
    if !common::privileged_or_skip("sigterm_mid_transfer_removes_the_partial_file_and_exits_143") {
        return;
    }
    let (r, names) = signal_mid_transfer("-TERM");
    assert!(
        names.iter().all(|n| !is_leftover(n)),
        "left behind: {names:?}"
    );
    assert_eq!(r.status.code(), Some(143), "{}", text(&r));
}

#[test]
fn sigint_mid_transfer_removes_the_partial_file_and_exits_130() {
    if !common::privileged_or_skip("sigint_mid_transfer_removes_the_partial_file_and_exits_130") {
        return;
    }
    let (r, names) = signal_mid_transfer("-INT");
    assert!(
        names.iter().all(|n| !is_leftover(n)),
        "left behind: {names:?}"
    );
    assert_eq!(r.status.code(), Some(130), "{}", text(&r));
}

/// `xroce file recv ARGS` with a deadline; it must exit by itself, before any sender.
fn recv_alone(args: &[&str]) -> Output {
    let mut cmd = Command::new(common::xroce_bin());
    cmd.args(["file", "recv", "-p", "18599", "-d", "lo", "--driver", "udp"])
        .args(args);
    let child = spawn(cmd, Path::new("/"), &[]);
    wait(
        child,
        Instant::now() + Duration::from_secs(10),
        "receiver with a bad -o (it must not wait for a sender)",
    )
}

#[test]
fn a_bad_output_is_refused_before_listening_and_named() {
    let dir = Dir::new("bad-o");
    let missing = dir.path().join("no-such-dir").join("copy.bin");
    let out = recv_alone(&["-o", missing.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&dir.path().join("no-such-dir").display().to_string()),
        "the error names the directory:\n{t}"
    );
    // A regular file where a directory should be.
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let out = recv_alone(&["-o", plain.join("copy.bin").to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains(&plain.display().to_string()), "{t}");
    // An existing file without --force: refused up front, untouched.
    let out = recv_alone(&["-o", plain.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("{} exists", plain.display())) && t.contains("--force"),
        "{t}"
    );
    assert_eq!(std::fs::read(&plain).unwrap(), b"x");
    assert_eq!(dir.names(), vec!["plain"], "no temporary file left");
}
