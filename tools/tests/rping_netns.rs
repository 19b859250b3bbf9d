//! `xroce rping` against itself between two network namespaces joined by a veth pair: the
//! server in A (`-s -v`), the client in B (`-c -v -V -C 10`), each its own process, over
//! AF_XDP and over the kernel UDP driver. Both must exit 0 and print exactly rping's lines:
//! ten `ping data: rdma-ping-N: ...` on the client, ten `server ping data: ...` on the
//! server, in order. A client whose server is not listening on its port is refused by the
//! peer's CM (REJ, invalid service ID) and exits non-zero within seconds.
//!
//! Needs root; under `XROCE_CI=1` a missing privilege fails, elsewhere it skips visibly.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::child::wait;
use xroce::netns::{LinkConfig, Netns, VethLink};

fn link() -> VethLink {
    // Addresses of their own in 198.18.0.0/15, so a run beside the other netns tests is
    // plain to tell apart in captures.
    let link = VethLink::create(&LinkConfig {
        a_ip: "198.18.7.1".parse().unwrap(),
        b_ip: "198.18.7.2".parse().unwrap(),
        ipv6: false,
        ..LinkConfig::default()
    })
    .expect("namespaces and veth pair");
    link.add_static_neighbours().expect("static neighbours");
    link
}

fn spawn(ns: &Netns, args: &[String]) -> Child {
    ns.command(common::xroce_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xroce")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}stderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// rping's ping `n` of size `size` as `%s` prints it: "rdma-ping-N: " then the letters from
/// 'A' + n (wrapping after 'z' to 'A'), `size - 1` characters in all.
fn ping_text(n: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = b'A' + (n % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c == b'z' { b'A' } else { c + 1 };
    }
    s
}

/// Server in A, client in B, over `driver`, both with `extra`; checks both outputs line by
/// line.
fn ten_pings(driver: &str, extra: &[&str]) {
    let link = link();
    let a_ip = link.a_ip.to_string();
    let mut server_args = strings(&["rping", "-s", "-v", "-a", &a_ip, "--driver", driver]);
    server_args.extend(strings(extra));
    let server = spawn(&link.a, &server_args);
    // The server listens once its device is open; a REQ before that is refused (REJ 8,
    // which the refusal test shows): then the client tries again, a few times.
    std::thread::sleep(Duration::from_millis(1000));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    let c = loop {
        tries += 1;
        let mut client_args = strings(&[
            "rping", "-c", "-v", "-V", "-C", "10", "-a", &a_ip, "--driver", driver,
        ]);
        client_args.extend(strings(extra));
        let client = spawn(&link.b, &client_args);
        let c = wait(client, deadline, "client");
        let early = String::from_utf8_lossy(&c.stderr).contains("RDMA_CM_EVENT_REJECTED, error 8");
        if !early || tries == 10 {
            break c;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let s = wait(server, deadline + Duration::from_secs(10), "server");
    assert!(
        c.status.success(),
        "client failed\n{}\nserver:\n{}",
        text(&c),
        text(&s)
    );
    assert!(
        s.status.success(),
        "server failed\n{}\nclient:\n{}",
        text(&s),
        text(&c)
    );
    let want_client: Vec<String> = (0..10)
        .map(|n| format!("ping data: {}", ping_text(n, 64)))
        .collect();
    let want_server: Vec<String> = (0..10)
        .map(|n| format!("server ping data: {}", ping_text(n, 64)))
        .collect();
    let got_client: Vec<String> = String::from_utf8_lossy(&c.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let got_server: Vec<String> = String::from_utf8_lossy(&s.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got_client, want_client, "client\n{}", text(&c));
    assert_eq!(got_server, want_server, "server\n{}", text(&s));
    // Both saw the disconnect as rping reports it.
    assert!(
        String::from_utf8_lossy(&s.stderr).contains("server DISCONNECT EVENT..."),
        "{}",
        text(&s)
    );
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn rping_ten_pings_over_af_xdp() {
    if !common::privileged_or_skip("rping_ten_pings_over_af_xdp") {
        return;
    }
    ten_pings("xdp", &[]);
}

#[test]
fn rping_ten_pings_over_udp() {
    if !common::privileged_or_skip("rping_ten_pings_over_udp") {
        return;
    }
    ten_pings("udp", &[]);
}

/// rping -q: both programs create their QPs and move them with rdma_init_qp_attr; the
/// client sends the RTU itself (rdma_establish) after CONNECT_RESPONSE.
#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn rping_self_created_qps_over_af_xdp() {
    if !common::privileged_or_skip("rping_self_created_qps_over_af_xdp") {
        return;
    }
    ten_pings("xdp", &["-q"]);
}

/// The line rping prints for the refusal, and a non-zero exit, within `limit`.
fn refused(link: &VethLink, port: &str, want: &str, limit: Duration) {
    let a_ip = link.a_ip.to_string();
    let t0 = Instant::now();
    let client = spawn(
        &link.b,
        &strings(&["rping", "-c", "-v", "-C", "1", "-a", &a_ip, "-p", port]),
    );
    let c = wait(
        client,
        t0 + limit + Duration::from_secs(30),
        "refused client",
    );
    let took = t0.elapsed();
    assert!(
        !c.status.success(),
        "a refused client exited 0\n{}",
        text(&c)
    );
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(err.contains(want), "no `{want}`\n{}", text(&c));
    assert!(err.contains("xroce: error: "), "{}", text(&c));
    assert!(!err.contains("panicked"), "{}", text(&c));
    assert!(c.stdout.is_empty(), "{}", text(&c));
    assert!(took < limit, "refusal took {took:?} (limit {limit:?})");
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn rping_without_a_listener_is_refused() {
    if !common::privileged_or_skip("rping_without_a_listener_is_refused") {
        return;
    }
    let link = link();
    // A's CM runs (a server on port 7175), but nobody listens on 7174: its CM answers the
    // REQ with REJ "invalid service ID" (IBTA 12.6.7, reason 8), as the kernel's does.
    let a_ip = link.a_ip.to_string();
    let mut server = spawn(
        &link.a,
        &strings(&["rping", "-s", "-a", &a_ip, "-p", "7175"]),
    );
    std::thread::sleep(Duration::from_millis(1500));
    refused(
        &link,
        "7174",
        "cma event RDMA_CM_EVENT_REJECTED, error 8",
        Duration::from_secs(5),
    );
    let _ = server.kill();
    let _ = server.wait();
}
