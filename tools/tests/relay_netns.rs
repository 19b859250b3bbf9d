//! Several processes on one interface, over AF_XDP between two network namespaces (root):
//! `xroce relay` owns each end's veth, and `xroce pingpong` processes share it. Two pairs run
//! RC at once (one client with `--driver relay`, one with the default driver, which falls
//! back to the relay because the interface is taken), two processes on one interface talk
//! to each other, and a client killed mid-transfer does not disturb the other pair.
//!
//! Needs root; under `XROCE_CI=1` a missing privilege fails, elsewhere it skips visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child::wait;
use xroce::netns::{LinkConfig, Netns, VethLink};

fn link() -> VethLink {
    let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth pair");
    link.add_static_neighbours().expect("static neighbours");
    link
}

/// A running `xroce relay`, its stdout lines collected; killed when dropped.
struct RelayProc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl RelayProc {
    fn start(ns: &Netns, ifname: &str) -> RelayProc {
        let mut child = ns
            .command(common::xroce_bin())
            .args(["relay", "-d", ifname, "--stats-interval", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn xroce relay");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
                let _ = tx.send(());
            }
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the relay did not start");
        let first = lines.lock().unwrap()[0].clone();
        assert!(first.contains("serving @xroce-relay-"), "{first}");
        RelayProc { child, lines }
    }

    /// The latest counter line (printed every second).
    fn stats_after(&self, wait: Duration) -> String {
        std::thread::sleep(wait);
        self.lines
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|l| l.starts_with("clients connected"))
            .cloned()
            .unwrap_or_default()
    }

    fn counter(line: &str, name: &str) -> u64 {
        let at = line
            .find(name)
            .unwrap_or_else(|| panic!("{name} in {line:?}"))
            + name.len();
        line[at..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(ns: &Netns, args: &[String]) -> Child {
    ns.command(common::xroce_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xroce")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn ok(out: &Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

/// `xroce pingpong` with `n` iterations on TCP port `port`, as a server (`host` None) or
/// the client of `host`, on `ifname`, with `driver` (None: the default driver).
fn pingpong(
    ifname: &str,
    port: u16,
    n: u32,
    host: Option<&str>,
    driver: Option<&str>,
) -> Vec<String> {
    let mut a = args(&["pingpong", "-g", "1", "-s", "4096", "-d", ifname]);
    a.extend(["-p".into(), port.to_string(), "-n".into(), n.to_string()]);
    if let Some(d) = driver {
        a.extend(["--driver".into(), d.into()]);
    }
    if let Some(h) = host {
        a.push(h.into());
    }
    a
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn two_processes_per_interface_talk_rc_at_once_and_to_each_other() {
    if !common::privileged_or_skip("two_processes_per_interface_talk_rc_at_once_and_to_each_other")
    {
        return;
    }
    let link = link();
    let relay_a = RelayProc::start(&link.a, &link.a_if);
    let relay_b = RelayProc::start(&link.b, &link.b_if);
    let host = link.a_ip.to_string();
    // Two servers in A, two clients in B, all at once; one client finds the relay by itself.
    let s1 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18601, 3000, None, Some("relay")),
    );
    let s2 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18602, 3000, None, Some("relay")),
    );
    std::thread::sleep(Duration::from_millis(500));
    let c1 = spawn(
        &link.b,
        &pingpong(&link.b_if, 18601, 3000, Some(&host), Some("relay")),
    );
    let c2 = spawn(
        &link.b,
        &pingpong(&link.b_if, 18602, 3000, Some(&host), None),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    for (child, what) in [
        (c1, "client 1"),
        (c2, "client 2 (default driver)"),
        (s1, "server 1"),
        (s2, "server 2"),
    ] {
        let text = ok(&wait(child, deadline, what), what);
        assert!(text.contains("3000 iters in"), "{what}: {text}");
    }
    // The client on the default driver went through the relay: B's relay served two.
    let line = relay_b.stats_after(Duration::from_millis(1200));
    assert_eq!(RelayProc::counter(&line, "clients connected"), 2, "{line}");
    // Two processes on A's interface, one the other's client: the relay hands their frames
    // across, none goes to the wire.
    let before = RelayProc::counter(
        &relay_a.stats_after(Duration::from_millis(1200)),
        "client->client",
    );
    let s3 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18603, 2000, None, Some("relay")),
    );
    std::thread::sleep(Duration::from_millis(500));
    let c3 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18603, 2000, Some(&host), Some("relay")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for (child, what) in [(c3, "local client"), (s3, "local server")] {
        let text = ok(&wait(child, deadline, what), what);
        assert!(text.contains("2000 iters in"), "{what}: {text}");
    }
    let line = relay_a.stats_after(Duration::from_millis(1500));
    let between = RelayProc::counter(&line, "client->client") - before;
    assert!(between >= 2 * 2000, "{line}");
    assert_eq!(RelayProc::counter(&line, "client full"), 0, "{line}");
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn a_client_killed_mid_transfer_does_not_disturb_the_other() {
    if !common::privileged_or_skip("a_client_killed_mid_transfer_does_not_disturb_the_other") {
        return;
    }
    let link = link();
    let _relay_a = RelayProc::start(&link.a, &link.a_if);
    let relay_b = RelayProc::start(&link.b, &link.b_if);
    let host = link.a_ip.to_string();
    let s1 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18611, 8000, None, Some("relay")),
    );
    let s2 = spawn(
        &link.a,
        &pingpong(&link.a_if, 18612, 1_000_000, None, Some("relay")),
    );
    std::thread::sleep(Duration::from_millis(500));
    let c1 = spawn(
        &link.b,
        &pingpong(&link.b_if, 18611, 8000, Some(&host), Some("relay")),
    );
    let mut c2 = spawn(
        &link.b,
        &pingpong(&link.b_if, 18612, 1_000_000, Some(&host), Some("relay")),
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        c2.try_wait().unwrap().is_none(),
        "the long client ended early"
    );
    c2.kill().unwrap();
    let _ = c2.wait();
    let deadline = Instant::now() + Duration::from_secs(90);
    for (child, what) in [(c1, "client 1"), (s1, "server 1")] {
        let text = ok(&wait(child, deadline, what), what);
        assert!(text.contains("8000 iters in"), "{what}: {text}");
    }
    let line = relay_b.stats_after(Duration::from_millis(1500));
    assert_eq!(RelayProc::counter(&line, "disconnected"), 2, "{line}");
    let mut s2 = s2;
    let _ = s2.kill();
    let _ = s2.wait();
}

/// `xroce rping` through the relay of `ifname`: the server of `addr` on `port`, or its
/// client, `count` pings.
fn rping(ifname: &str, addr: &str, port: u16, count: u32, server: bool) -> Vec<String> {
    let mut a = args(&["rping", if server { "-s" } else { "-c" }, "-v", "-a", addr]);
    a.extend([
        "-p".into(),
        port.to_string(),
        "-C".into(),
        count.to_string(),
    ]);
    a.extend(args(&["-D", ifname, "--driver", "relay"]));
    a
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn the_rdma_cm_of_two_processes_per_interface() {
    if !common::privileged_or_skip("the_rdma_cm_of_two_processes_per_interface") {
        return;
    }
    let link = link();
    let relay_a = RelayProc::start(&link.a, &link.a_if);
    let relay_b = RelayProc::start(&link.b, &link.b_if);
    let host = link.a_ip.to_string();
    // Two rping servers behind A's relay on two ports, two clients behind B's: each REQ
    // reaches the server listening on its port, each REP/RTU/DREQ/DREP the right process.
    let s1 = spawn(&link.a, &rping(&link.a_if, &host, 18611, 5, true));
    let s2 = spawn(&link.a, &rping(&link.a_if, &host, 18612, 5, true));
    std::thread::sleep(Duration::from_millis(700));
    let c1 = spawn(&link.b, &rping(&link.b_if, &host, 18611, 5, false));
    let c2 = spawn(&link.b, &rping(&link.b_if, &host, 18612, 5, false));
    let deadline = Instant::now() + Duration::from_secs(60);
    for (child, what) in [
        (c1, "client 1"),
        (c2, "client 2"),
        (s1, "server 1"),
        (s2, "server 2"),
    ] {
        let text = ok(&wait(child, deadline, what), what);
        if what.starts_with("client") {
            assert!(text.contains("ping data: rdma-ping-4: "), "{what}: {text}");
        }
    }
    // A port nobody listens on: the REQ gets its REJ (from a CM behind the relay).
    let s3 = spawn(&link.a, &rping(&link.a_if, &host, 18613, 2, true));
    std::thread::sleep(Duration::from_millis(700));
    let lone = spawn(&link.b, &rping(&link.b_if, &host, 18614, 2, false));
    let out = wait(lone, Instant::now() + Duration::from_secs(30), "unlistened");
    assert!(
        !out.status.success(),
        "a connection to a port nobody listens on"
    );
    // And a local client of the server on the same interface, through A's relay.
    let c3 = spawn(&link.a, &rping(&link.a_if, &host, 18613, 2, false));
    let deadline = Instant::now() + Duration::from_secs(30);
    for (child, what) in [(c3, "local client"), (s3, "server 3")] {
        ok(&wait(child, deadline, what), what);
    }
    for (relay, which) in [(&relay_a, "A"), (&relay_b, "B")] {
        let line = relay.stats_after(Duration::from_millis(1200));
        assert!(
            RelayProc::counter(&line, "CM MADs routed") >= 4,
            "{which}: {line}"
        );
        assert_eq!(RelayProc::counter(&line, "QP1"), 0, "{which}: {line}");
    }
    let line = relay_a.stats_after(Duration::from_millis(0));
    assert!(RelayProc::counter(&line, "unlistened") >= 1, "{line}");
}
