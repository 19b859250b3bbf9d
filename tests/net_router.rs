//! RoCE v2 through a router: two endpoint namespaces on two subnets, joined by a router
//! namespace that forwards between them (two veth pairs, `ip_forward` on, routes via the
//! router on both ends), and the whole operation suite of `tests/verbs_net.rs` (SEND,
//! SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, FETCH_ADD, CMP_SWAP, and UD datagrams) over
//! AF_XDP and over the UDP driver. Frames to a peer behind a router must carry the router's
//! MAC: the next hop comes from the kernel's route, its MAC from the neighbour table.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the tests skip visibly.
mod common;
#[path = "common/verbs_suite.rs"]
mod verbs_suite;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{expect_both, privileged_or_skip, Helper};
use verbs_suite::{helper_main, say};
use xroce::netns::{unique_ifname, Netns};

const HELPER_TIMEOUT: Duration = Duration::from_secs(120);
const TCP_PORT: u16 = 18620;

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

/// A ── R ── B: A is 198.18.1.2/24 (router side 198.18.1.1), B is 198.19.2.2/24 (router
/// side 198.19.2.1). Dropping it deletes the three namespaces and both veth pairs.
struct Routed {
    a: Netns,
    b: Netns,
    _r: Netns,
    a_if: String,
    b_if: String,
    a_ip: Ipv4Addr,
    b_ip: Ipv4Addr,
    /// The MAC of the router's interface on A's subnet: what A's frames to B must carry.
    router_mac_on_a: [u8; 6],
}

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const RA_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 2);
const RB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 2, 1);

impl Routed {
    fn create() -> Routed {
        let a = Netns::create("netpcap-ra").expect("namespace A");
        let r = Netns::create("netpcap-rr").expect("router namespace");
        let b = Netns::create("netpcap-rb").expect("namespace B");
        let (a_if, ra_if, b_if, rb_if) = (
            unique_ifname('a'),
            unique_ifname('r'),
            unique_ifname('b'),
            unique_ifname('s'),
        );
        for (ns, end, router_end) in [(&a, &a_if, &ra_if), (&b, &b_if, &rb_if)] {
            ns.ip(&[
                "link",
                "add",
                end,
                "type",
                "veth",
                "peer",
                "name",
                router_end,
                "netns",
                r.name(),
            ])
            .expect("veth pair");
        }
        let up = |ns: &Netns, ifname: &str, addr: &str| {
            ns.ip(&["addr", "add", addr, "dev", ifname]).unwrap();
            ns.ip(&["link", "set", "dev", ifname, "up"]).unwrap();
        };
        up(&a, &a_if, &format!("{A_IP}/24"));
        up(&r, &ra_if, &format!("{RA_IP}/24"));
        up(&r, &rb_if, &format!("{RB_IP}/24"));
        up(&b, &b_if, &format!("{B_IP}/24"));
        a.ip(&["route", "add", "198.19.2.0/24", "via", &RA_IP.to_string()])
            .unwrap();
        b.ip(&["route", "add", "198.18.1.0/24", "via", &RB_IP.to_string()])
            .unwrap();
        r.sysctl("net.ipv4.ip_forward=1").expect("ip_forward");
        let router_mac_on_a = r.mac(&ra_if).unwrap();
        Routed {
            a,
            b,
            _r: r,
            a_if,
            b_if,
            a_ip: A_IP,
            b_ip: B_IP,
            router_mac_on_a,
        }
    }
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs roles `server` in B and `client` in A (or the `ud-` pair) and returns both verdicts.
fn run_pair(net: &Routed, driver: &str, roles: (&str, &str), sizes: &str) -> (String, String) {
    let addr = SocketAddr::new(net.b_ip.into(), TCP_PORT).to_string();
    let env_for = |ifname: &str| {
        vec![
            ("XV_IFNAME", ifname.to_string()),
            ("XV_DRIVER", driver.to_string()),
            ("XV_ADDR", addr.clone()),
            ("XV_SIZES", sizes.to_string()),
            ("XV_QPS", "1".to_string()),
            ("XV_MTU", "1024".to_string()),
        ]
    };
    let mut server = Helper::spawn(&net.b, roles.0, &env_for(&net.b_if));
    server.expect("LISTENING", Duration::from_secs(30));
    let mut client = Helper::spawn(&net.a, roles.1, &env_for(&net.a_if));
    let (c, s) = expect_both(&mut client, &mut server, "PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}\nserver: {s}");
    (c, s)
}

fn every_op(driver: &str) {
    let net = Routed::create();
    let (c, s) = run_pair(
        &net,
        driver,
        ("server", "client"),
        "0,1,1023,1024,1025,65536,1048576",
    );
    assert!(c.contains(&format!("driver={driver}")), "{c}");
    assert!(c.contains(&format!("gid=::ffff:{}", net.a_ip)), "{c}");
    assert!(s.contains(&format!("gid=::ffff:{}", net.b_ip)), "{s}");
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_every_op_through_a_router() {
    if !privileged_or_skip("xdp_every_op_through_a_router") {
        return;
    }
    every_op("xdp");
}

#[test]
fn udp_every_op_through_a_router() {
    if !privileged_or_skip("udp_every_op_through_a_router") {
        return;
    }
    every_op("udp");
}

fn ud(driver: &str) {
    let net = Routed::create();
    let (c, s) = run_pair(&net, driver, ("ud-server", "ud-client"), "0,1,1000,1024");
    assert!(s.contains("received 4 datagrams"), "{s}");
    // The address handle carries the router's MAC, not one of B's.
    let router: Vec<String> = net.router_mac_on_a.iter().map(|b| b.to_string()).collect();
    assert!(
        c.contains(&format!("dest mac [{}]", router.join(", "))),
        "the AH's MAC must be the router's {}: {c}",
        mac_text(net.router_mac_on_a)
    );
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_ud_through_a_router() {
    if !privileged_or_skip("xdp_ud_through_a_router") {
        return;
    }
    ud("xdp");
}

#[test]
fn udp_ud_through_a_router() {
    if !privileged_or_skip("udp_ud_through_a_router") {
        return;
    }
    ud("udp");
}

/// The MAC for a peer behind the router is the router's, found over netlink without running
/// `ip` (an `ip` first in PATH would record it), and an absent on-link address still fails
/// with a typed error within its timeout.
#[test]
fn neighbour_of_a_routed_peer_is_the_router() {
    if !privileged_or_skip("neighbour_of_a_routed_peer_is_the_router") {
        return;
    }
    let net = Routed::create();
    let mut helper = Helper::spawn(
        &net.a,
        "neigh",
        &[
            ("XV_IFNAME", net.a_if.clone()),
            ("XV_PEER_IP", net.b_ip.to_string()),
            ("XV_ABSENT_IP", "198.18.1.77".into()),
            ("XV_TRAP_IP", "1".into()),
        ],
    );
    let out = helper.expect("PASS", HELPER_TIMEOUT);
    eprintln!("{out}");
    let mac = mac_text(net.router_mac_on_a);
    assert!(out.contains("before=None"), "{out}");
    assert!(
        out.contains(&format!("mac={mac}")),
        "resolved to the router's MAC {mac}: {out}"
    );
    assert!(out.contains("absent_typed=true"), "{out}");
    assert!(out.contains("ip_runs=0"), "no `ip` process: {out}");
    let resolve_ms: u64 = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("resolve_ms="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(resolve_ms < 1000, "resolution took {resolve_ms} ms");
}
