//! QP1 (the GSI) over real (virtual) links: two namespaces joined by a veth pair, an xroce
//! device in each (this test binary re-run as a helper via `ip netns exec`). Side A resolves
//! the route to B from netlink (next hop MAC, source GID index) and sends a MAD from QP1 to
//! B's QP1; B answers to where it came from. Over AF_XDP and over the kernel UDP driver. Route
//! resolution of an address nobody answers gives a typed error within its timeout, one with
//! no route another.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the tests skip visibly.
mod common;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::{privileged_or_skip, Helper};
use xroce::netdev::NetdevError;
use xroce::netns::{LinkConfig, VethLink};
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(10);

fn say(s: String) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}").unwrap();
    out.flush().unwrap();
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"))
}

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

fn mad(tag: u8) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    for (i, b) in m.iter_mut().enumerate() {
        *b = tag ^ (i as u8);
    }
    m
}

fn helper_main(role: &str) -> Result<String, String> {
    let ifname = env("XG_IFNAME");
    let driver = match env("XG_DRIVER").as_str() {
        "udp" => DriverKind::Udp,
        _ => DriverKind::Xdp,
    };
    let dev = Device::open(
        &ifname,
        DeviceConfig {
            driver,
            neighbour_timeout: Duration::from_millis(1500),
            ..DeviceConfig::default()
        },
    )
    .map_err(|e| format!("opening {ifname}: {e}"))?;
    let gsi = dev.open_gsi().map_err(|e| format!("open_gsi: {e}"))?;
    if dev.open_gsi().is_ok() {
        return Err("a second GSI opened".into());
    }
    match role {
        "b" => {
            say("READY".into());
            let rounds = if std::env::var_os("XG_PEER6").is_some() {
                2
            } else {
                1
            };
            let mut got = None;
            for _ in 0..rounds {
                let m = gsi
                    .recv_timeout(Duration::from_secs(30))
                    .map_err(|e| e.to_string())?;
                if *m.mad != mad(0x3c) || m.src_qpn != 1 {
                    return Err(format!("unexpected MAD from QPN {}", m.src_qpn));
                }
                gsi.send(&m.reply_to(), &mad(0xc3))
                    .map_err(|e| e.to_string())?;
                got.get_or_insert(m);
            }
            let got = got.expect("one round at least");
            // Stay until the answer is out.
            std::thread::sleep(Duration::from_millis(500));
            let c = dev.counters();
            Ok(format!(
                "from={} mac={} gsi_rcvd={} gsi_sent={} bad_icrc={}",
                got.src_gid.to_ip(),
                got.src_mac,
                c.gsi_rcvd,
                c.gsi_sent,
                c.drops.bad_icrc
            ))
        }
        _ => {
            let peer: IpAddr = env("XG_PEER").parse().unwrap();
            let peer_mac = env("XG_PEER_MAC");
            let route = dev
                .resolve_route(peer)
                .map_err(|e| format!("route to {peer}: {e}"))?;
            if route.mac.to_string() != peer_mac {
                return Err(format!("next hop MAC {} is not {peer_mac}", route.mac));
            }
            if route.gateway.is_some() {
                return Err(format!("on-link peer has a gateway: {route:?}"));
            }
            let to = MadAddress {
                mac: Some(route.mac),
                ..MadAddress::gsi(Gid::from_ip(peer), route.sgid_index as u8)
            };
            gsi.send(&to, &mad(0x3c)).map_err(|e| e.to_string())?;
            let answer = gsi.recv_timeout(WAIT).map_err(|e| format!("answer: {e}"))?;
            if *answer.mad != mad(0xc3) || answer.src_qpn != 1 || answer.src_gid.to_ip() != peer {
                return Err(format!("unexpected answer {answer:?}"));
            }
            // Over IPv6 too: ND for the next hop, an IPv6 source GID.
            let mut over_v6 = String::new();
            if let Ok(peer6) = std::env::var("XG_PEER6") {
                let peer6: IpAddr = peer6.parse().unwrap();
                // Right after the link comes up the kernel's first solicitation waits for
                // the link-local address's duplicate address detection (about a second):
                // one more try then.
                let route6 = dev
                    .resolve_route(peer6)
                    .or_else(|_| dev.resolve_route(peer6))
                    .map_err(|e| format!("route to {peer6}: {e}"))?;
                if route6.mac.to_string() != peer_mac || !route6.source.is_ipv6() {
                    return Err(format!("route to {peer6}: {route6:?}"));
                }
                let to6 = MadAddress::gsi(Gid::from_ip(peer6), route6.sgid_index as u8);
                gsi.send(&to6, &mad(0x3c)).map_err(|e| e.to_string())?;
                let answer = gsi
                    .recv_timeout(WAIT)
                    .map_err(|e| format!("answer v6: {e}"))?;
                if *answer.mad != mad(0xc3) || answer.src_gid.to_ip() != peer6 {
                    return Err(format!("unexpected answer over IPv6 {answer:?}"));
                }
                over_v6 = format!(" v6_from={}", route6.source);
            }
            // Nobody has this on-link address: a typed error within the timeout.
            let t = Instant::now();
            let nobody = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 77));
            match dev.resolve_route(nobody) {
                Err(VerbsError::Netdev(
                    NetdevError::NeighbourTimeout { .. } | NetdevError::NeighbourFailed { .. },
                )) => {}
                other => return Err(format!("route to {nobody}: {other:?}")),
            }
            let took = t.elapsed();
            if took > Duration::from_millis(1500) + Duration::from_secs(1) {
                return Err(format!("unreachable took {took:?}"));
            }
            // No route at all (the namespace has no default route).
            let unrouted = IpAddr::V4(Ipv4Addr::new(198, 19, 200, 1));
            match dev.resolve_route(unrouted) {
                Err(VerbsError::Netdev(NetdevError::NoRoute { .. })) => {}
                other => return Err(format!("route to {unrouted}: {other:?}")),
            }
            let c = dev.counters();
            Ok(format!(
                "if={} gsi_sent={} gsi_rcvd={} unreachable_after={took:?}{over_v6}",
                dev.driver_info().name,
                c.gsi_sent,
                c.gsi_rcvd
            ))
        }
    }
}

fn run(driver: &str) {
    // The UDP driver binds one address (one family): IPv6 only over AF_XDP.
    let v6 = driver == "xdp";
    let link = VethLink::create(&LinkConfig {
        ipv6: v6,
        ..LinkConfig::default()
    })
    .expect("creating namespaces and veth");
    let mac = |m: [u8; 6]| MacAddr(m).to_string();
    let env_for = |ifname: &str| {
        let mut env = vec![
            ("XG_IFNAME", ifname.to_string()),
            ("XG_DRIVER", driver.to_string()),
            ("XG_PEER", link.b_ip.to_string()),
            ("XG_PEER_MAC", mac(link.b_mac)),
        ];
        if let Some(b6) = link.b_ip6.filter(|_| v6) {
            env.push(("XG_PEER6", b6.to_string()));
        }
        env
    };
    let mut b = Helper::spawn(&link.b, "b", &env_for(&link.b_if));
    b.expect("READY", Duration::from_secs(30));
    let mut a = Helper::spawn(&link.a, "a", &env_for(&link.a_if));
    let pa = a.expect("PASS", Duration::from_secs(60));
    let pb = b.expect("PASS", Duration::from_secs(60));
    eprintln!("a: {pa}\nb: {pb}");
    let n = if v6 { 2 } else { 1 };
    assert!(pa.contains(&format!("gsi_sent={n} gsi_rcvd={n}")), "{pa}");
    assert!(pb.contains(&format!("gsi_rcvd={n} gsi_sent={n}")), "{pb}");
    if v6 {
        assert!(pa.contains("v6_from=2001:2::1"), "{pa}");
    }
    assert!(pb.contains(&format!("from={} ", link.a_ip)), "{pb}");
    if driver == "xdp" {
        // The UDP driver cannot see Ethernet headers: no MAC to check there.
        assert!(pb.contains(&format!("mac={}", mac(link.a_mac))), "{pb}");
    }
    a.wait();
    b.wait();
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn xdp_mads_between_two_gsis_and_route_resolution() {
    if !privileged_or_skip("xdp_mads_between_two_gsis_and_route_resolution") {
        return;
    }
    run("xdp");
}

#[test]
fn udp_mads_between_two_gsis_and_route_resolution() {
    if !privileged_or_skip("udp_mads_between_two_gsis_and_route_resolution") {
        return;
    }
    run("udp");
}
