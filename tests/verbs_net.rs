//! The verbs API over real (virtual) links: two network namespaces joined by a veth pair, an
//! xroce endpoint process in each (this test binary re-run as a helper via `ip netns exec`),
//! over AF_XDP and over the kernel UDP driver.
//!
//! Both endpoints run the whole operation suite towards each other at the same time (both
//! directions): SEND, SEND_WITH_IMM, RDMA_WRITE (checked by reading it back), RDMA_WRITE_WITH_IMM,
//! RDMA_READ, FETCH_ADD, CMP_SWAP, for message sizes from 0 bytes to several MiB, at path MTU
//! 1024 (1500-byte link) and 4096 (9000-byte link), on many QPs at once; a peer that vanishes
//! gives RETRY_EXC_ERR within the configured timeout; ping still works while xroce runs.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the tests skip visibly.
mod common;
#[path = "common/verbs_suite.rs"]
mod verbs_suite;

use std::net::SocketAddr;
use std::time::Duration;

use common::{expect_both, privileged_or_skip, Helper};
use verbs_suite::{helper_main, say};
use xroce::netdev::{link_local_from_mac, MacAddr};
use xroce::netns::{LinkConfig, VethLink};

const HELPER_TIMEOUT: Duration = Duration::from_secs(120);
const TCP_PORT: u16 = 18600;

#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    match helper_main(&role) {
        Ok(summary) => say(format!("PASS {summary}")),
        Err(e) => say(format!("ERROR {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// The tests: create the link, start both helpers, read their verdicts.

struct Run {
    link: VethLink,
    server: Helper,
    client: Helper,
}

fn start(
    driver: &str,
    link_mtu: u32,
    path_mtu: u32,
    qps: usize,
    sizes: &[usize],
    extra: &[(&str, String)],
) -> Run {
    let queues = extra
        .iter()
        .find(|(k, _)| *k == "XV_QUEUES")
        .map_or(1, |(_, v)| v.parse().unwrap());
    let link = VethLink::create(&LinkConfig {
        mtu: link_mtu,
        ipv6: extra.iter().any(|(k, v)| *k == "XV_FAMILY" && v == "6"),
        queues,
        ..LinkConfig::default()
    })
    .expect("creating namespaces and veth");
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let sizes: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let env_for = |ifname: &str| {
        let mut env = vec![
            ("XV_IFNAME", ifname.to_string()),
            ("XV_DRIVER", driver.to_string()),
            ("XV_ADDR", addr.clone()),
            ("XV_SIZES", sizes.join(",")),
            ("XV_QPS", qps.to_string()),
            ("XV_MTU", path_mtu.to_string()),
        ];
        env.extend(extra.iter().cloned());
        env
    };
    let mut server = Helper::spawn(&link.b, "server", &env_for(&link.b_if));
    let listening = server.expect("LISTENING", Duration::from_secs(30));
    eprintln!("server: {listening}");
    let client = Helper::spawn(&link.a, "client", &env_for(&link.a_if));
    Run {
        link,
        server,
        client,
    }
}

fn both_pass(run: &mut Run) -> (String, String) {
    let (c, s) = expect_both(&mut run.client, &mut run.server, "PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}\nserver: {s}");
    (c, s)
}

const MIB: usize = 1 << 20;

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_every_op_both_directions_path_mtu_1024() {
    if !privileged_or_skip("xdp_every_op_both_directions_path_mtu_1024") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        1,
        &[0, 1, 1023, 1024, 1025, 65536, 3 * MIB],
        &[],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("driver=xdp-"), "{c}");
    assert!(c.contains("bad_icrc=0"), "{c}");
}

/// Two engine shards on a veth pair with two queues: QP i on shard i % 2 at both ends, so
/// each flow's frames go out on queue i % 2 and arrive on the peer's queue i % 2, the queue
/// of the shard that owns the QP there: nothing is handed between shards.
#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_every_op_on_two_engine_shards() {
    if !privileged_or_skip("xdp_every_op_on_two_engine_shards") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        4,
        &[0, 1, 1025, 65536, MIB],
        &[
            ("XV_SHARDS", "2".to_string()),
            ("XV_QUEUES", "2".to_string()),
        ],
    );
    let (c, s) = both_pass(&mut run);
    for summary in [&c, &s] {
        assert!(
            summary.contains("shards=2 qp_shards=[0, 1, 0, 1]"),
            "{summary}"
        );
        assert!(summary.contains("handed_off=0"), "{summary}");
        assert!(summary.contains("bad_icrc=0"), "{summary}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_every_op_both_directions_path_mtu_4096_on_9000_link() {
    if !privileged_or_skip("xdp_every_op_both_directions_path_mtu_4096_on_9000_link") {
        return;
    }
    let mut run = start("xdp", 9000, 4096, 1, &[0, 4095, 4096, 4097, 4 * MIB], &[]);
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("mtu=4096"), "{c}");
}

#[test]
fn udp_every_op_both_directions() {
    if !privileged_or_skip("udp_every_op_both_directions") {
        return;
    }
    let mut run = start("udp", 1500, 1024, 1, &[0, 1, 1025, 65536, 2 * MIB], &[]);
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("driver=udp"), "{c}");
}

#[test]
fn udp_path_mtu_4096_on_9000_link() {
    if !privileged_or_skip("udp_path_mtu_4096_on_9000_link") {
        return;
    }
    let mut run = start("udp", 9000, 4096, 1, &[0, 4097, MIB], &[]);
    both_pass(&mut run);
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_many_qps_and_ping_still_reaches_the_kernel() {
    if !privileged_or_skip("xdp_many_qps_and_ping_still_reaches_the_kernel") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        24,
        &[0, 3000, 20000],
        &[("XV_HOLD_MS", "3000".into())],
    );
    let c = run.client.expect("HOLDING", HELPER_TIMEOUT);
    run.server.expect("HOLDING", HELPER_TIMEOUT);
    // Both endpoints hold their devices (XDP attached) while ICMP and TCP flow.
    assert!(
        run.link.a.has_xdp(&run.link.a_if).unwrap(),
        "XDP attached on a"
    );
    assert!(
        run.link.b.has_xdp(&run.link.b_if).unwrap(),
        "XDP attached on b"
    );
    let ping = run
        .link
        .a
        .command("ping")
        .args([
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
            &run.link.b_ip.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "ping failed while xroce runs: {ping:?}"
    );
    eprintln!("client: {c}");
    assert!(c.contains("qps=24"));
    expect_both(&mut run.client, &mut run.server, "PASS", HELPER_TIMEOUT);
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_every_op_over_ipv6_gids() {
    if !privileged_or_skip("xdp_every_op_over_ipv6_gids") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        2,
        &[0, 1500, 100_000],
        &[("XV_FAMILY", "6".into())],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("gid=2001:2::"), "{c}");
}

#[test]
fn udp_every_op_over_ipv6_gids() {
    if !privileged_or_skip("udp_every_op_over_ipv6_gids") {
        return;
    }
    let mut run = start(
        "udp",
        1500,
        1024,
        2,
        &[0, 1500, 100_000],
        &[("XV_FAMILY", "6".into())],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("gid=2001:2::"), "{c}");
}

fn vanished_peer(driver: &str) {
    let mut run = start(driver, 1500, 1024, 1, &[64], &[("XV_VANISH", "1".into())]);
    run.server.expect("VANISHING", HELPER_TIMEOUT);
    let c = run.client.expect("PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}");
    assert!(c.contains("status=RetryExcErr"), "{c}");
    assert!(c.contains("state=Err"), "{c}");
    assert!(c.contains("retry_exceeded_err=1"), "{c}");
    let ms: u64 = c
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ms="))
        .unwrap()
        .parse()
        .unwrap();
    // timeout 12 (16.8 ms) x (1 + retry_cnt 3) = 67 ms; allow scheduling slack.
    assert!(
        (60..2000).contains(&ms),
        "RETRY_EXC_ERR after {ms} ms, expected about 67 ms"
    );
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_vanished_peer_gives_retry_exceeded() {
    if !privileged_or_skip("xdp_vanished_peer_gives_retry_exceeded") {
        return;
    }
    vanished_peer("xdp");
}

#[test]
fn udp_vanished_peer_gives_retry_exceeded() {
    if !privileged_or_skip("udp_vanished_peer_gives_retry_exceeded") {
        return;
    }
    vanished_peer("udp");
}

/// Runs the "neigh" helper in A's namespace: resolves `peer`, then fails to resolve
/// `absent`; returns its PASS line.
fn resolve_from_a(link: &VethLink, peer: &str, absent: &str) -> String {
    let mut helper = Helper::spawn(
        &link.a,
        "neigh",
        &[
            ("XV_IFNAME", link.a_if.clone()),
            ("XV_PEER_IP", peer.to_string()),
            ("XV_ABSENT_IP", absent.to_string()),
        ],
    );
    let out = helper.expect("PASS", HELPER_TIMEOUT);
    eprintln!("{out}");
    let mac = MacAddr(link.b_mac);
    assert!(
        out.contains(&format!("mac={mac}")),
        "resolved to the peer's MAC {mac}: {out}"
    );
    out
}

/// The number after `name=` in a helper's line.
fn field(out: &str, name: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {out}"))
}

#[test]
fn neighbour_resolution_through_the_kernel() {
    if !privileged_or_skip("neighbour_resolution_through_the_kernel") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .unwrap();
    let out = resolve_from_a(&link, &link.b_ip.to_string(), "198.18.0.77");
    assert!(
        out.contains("before=None"),
        "a fresh namespace has no entry yet: {out}"
    );
    assert!(out.contains("absent_typed=true"), "{out}");
    let ms = field(&out, "absent_ms");
    assert!(
        (500..3000).contains(&ms),
        "gave up after {ms} ms, timeout was 500 ms"
    );
}

/// Netlink's solicitation (what the kernel's own rdma_cm does too) carries no packet, so IPv6
/// sends its Neighbor Solicitation from the link-local address, and none while that address is
/// tentative. Here the link-local address stays tentative for a minute (60 DAD probes), which
/// is what every fresh interface has for a second or two: resolving a global IPv6 peer must not
/// wait for it.
#[test]
fn ipv6_neighbour_resolves_while_the_link_local_address_is_tentative() {
    if !privileged_or_skip("ipv6_neighbour_resolves_while_the_link_local_address_is_tentative") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        ipv6: true,
        ..LinkConfig::default()
    })
    .unwrap();
    let (a_ip6, b_ip6) = (link.a_ip6.unwrap(), link.b_ip6.unwrap());
    let ifname = link.a_if.as_str();
    // Taking the link down flushes its IPv6 addresses; up again, the link-local one starts a
    // slow duplicate address detection and the global one is added back without any.
    link.a.ip(&["link", "set", "dev", ifname, "down"]).unwrap();
    link.a
        .sysctl(&format!("net.ipv6.conf.{ifname}.dad_transmits=60"))
        .unwrap();
    link.a.ip(&["link", "set", "dev", ifname, "up"]).unwrap();
    link.a
        .ip(&[
            "addr",
            "replace",
            &format!("{a_ip6}/64"),
            "dev",
            ifname,
            "nodad",
        ])
        .unwrap();
    let out = resolve_from_a(&link, &b_ip6.to_string(), "2001:2::77");
    let addrs = link.a.ip(&["-6", "addr", "show", "dev", ifname]).unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout).to_string();
    assert!(
        addrs
            .lines()
            .any(|l| l.contains("fe80::") && l.contains("tentative")),
        "the link-local address was meant to be tentative throughout: {addrs}"
    );
    assert!(out.contains("absent_typed=true"), "{out}");
    // Asked with a packet from the global address, the kernel solicits at once; anything
    // later waited for the kernel's one-second retransmission.
    let ms = field(&out, "resolve_ms");
    assert!(ms < 1000, "resolved after {ms} ms");
}

/// GID 0 of a RoCE port is the link-local address made from its MAC, also where the interface
/// has no IPv6 at all (libfabric's verbs datagram endpoints always use it). As Linux's RDMA
/// core does, such a destination's MAC is read from the address: here neither side has IPv6,
/// so no Neighbor Discovery could answer. A link-local address not made from a MAC still goes
/// to the kernel (which, without IPv6, has no route for it).
#[test]
fn a_link_local_gid_resolves_to_the_mac_it_was_made_from() {
    if !privileged_or_skip("a_link_local_gid_resolves_to_the_mac_it_was_made_from") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .unwrap();
    for (ns, ifname) in [(&link.a, &link.a_if), (&link.b, &link.b_if)] {
        ns.sysctl(&format!("net.ipv6.conf.{ifname}.disable_ipv6=1"))
            .unwrap();
    }
    let peer_gid0 = link_local_from_mac(MacAddr(link.b_mac));
    let out = resolve_from_a(&link, &peer_gid0.to_string(), "fe80::1234:5678:9abc:def0");
    // Without IPv6 there is no route for the kernel to resolve it on: said so.
    assert!(
        out.contains("no route to fe80::1234:5678:9abc:def0"),
        "{out}"
    );
}

fn ud_datagrams(driver: &str) {
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .unwrap();
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let env_for = |ifname: &str| {
        vec![
            ("XV_IFNAME", ifname.to_string()),
            ("XV_DRIVER", driver.to_string()),
            ("XV_ADDR", addr.clone()),
            ("XV_SIZES", "0,1,1000,1024".to_string()),
        ]
    };
    let mut server = Helper::spawn(&link.b, "ud-server", &env_for(&link.b_if));
    server.expect("LISTENING", Duration::from_secs(30));
    let mut client = Helper::spawn(&link.a, "ud-client", &env_for(&link.a_if));
    let (c, s) = expect_both(&mut client, &mut server, "PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}\nserver: {s}");
    assert!(s.contains("received 4 datagrams"));
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_ud_datagrams_through_an_address_handle() {
    if !privileged_or_skip("xdp_ud_datagrams_through_an_address_handle") {
        return;
    }
    ud_datagrams("xdp");
}

#[test]
fn udp_ud_datagrams_through_an_address_handle() {
    if !privileged_or_skip("udp_ud_datagrams_through_an_address_handle") {
        return;
    }
    ud_datagrams("udp");
}
