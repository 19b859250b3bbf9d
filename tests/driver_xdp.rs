//! The AF_XDP driver on a real veth pair between two namespaces.
//!
//! Each endpoint runs as a child process inside its namespace (`ip netns exec`), because
//! setns would only move one thread: the child is this same test binary, re-run with
//! `XROCE_DRIVER_HELPER=<role>` on its `helper` test (see the bottom of the file).
//!
//! Built only with the `xdp` feature (`required-features` in Cargo.toml): every test here
//! opens `driver::xdp`, which does not exist without it.
mod common;
#[path = "common/packet.rs"]
mod packet;
#[path = "common/roce.rs"]
mod roce;

use common::{hex, unhex, Helper};

use std::io::Write;
use std::path::PathBuf;

use std::time::{Duration, Instant};

use etherparse::{PacketBuilder, VlanId};
use packet::{Direction, PacketSocket};
use xroce::driver::xdp::{AttachMode, XdpConfig, XdpDriver, ZeroCopy};
use xroce::driver::{poll_readable, Driver, DriverError};
use xroce::netns::{LinkConfig, VethLink};

const ROCE_PORT: u16 = 4791;

// ---------------------------------------------------------------------------------------
// Frame building

/// A RoCE-looking UDP payload: a BTH (UD SEND_ONLY, dest QP 0x11) + `len` bytes + an ICRC
/// placeholder. The driver carries bytes; it does not check them.
fn roce_payload(seed: u8, len: usize) -> Vec<u8> {
    let mut p = vec![0x64, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, seed];
    p.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    p.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    p
}

enum Vlan {
    None,
    Single(u16),
    Double(u16, u16),
}

fn ipv4_frame(link: &VethLink, vlan: Vlan, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(link.a_mac, link.b_mac);
    let (src, dst) = (link.a_ip.octets(), link.b_ip.octets());
    let mut out = Vec::new();
    match vlan {
        Vlan::None => eth
            .ipv4(src, dst, 64)
            .udp(0xc001, dst_port)
            .write(&mut out, payload),
        Vlan::Single(id) => eth
            .single_vlan(VlanId::try_new(id).unwrap())
            .ipv4(src, dst, 64)
            .udp(0xc001, dst_port)
            .write(&mut out, payload),
        Vlan::Double(o, i) => eth
            .double_vlan(VlanId::try_new(o).unwrap(), VlanId::try_new(i).unwrap())
            .ipv4(src, dst, 64)
            .udp(0xc001, dst_port)
            .write(&mut out, payload),
    }
    .unwrap();
    out
}

fn ipv6_frame(link: &VethLink, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(link.a_mac, link.b_mac)
        .ipv6(
            link.a_ip6.unwrap().octets(),
            link.b_ip6.unwrap().octets(),
            64,
        )
        .udp(0xc002, ROCE_PORT)
        .write(&mut out, payload)
        .unwrap();
    out
}

/// IPv4 with 8 bytes of options (two NOPs + a 4-byte "router alert"-like option + EOL pad):
/// built by hand because the option bytes shift the UDP header.
fn ipv4_with_options_frame(link: &VethLink, payload: &[u8]) -> Vec<u8> {
    let plain = ipv4_frame(link, Vlan::None, ROCE_PORT, payload);
    let mut f = plain[..14].to_vec();
    let ip = &plain[14..34];
    let udp_and_payload = &plain[34..];
    let options = [0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00];
    let total = 20 + options.len() + udp_and_payload.len();
    let mut hdr = ip.to_vec();
    hdr[0] = 0x47; // version 4, IHL 7 words
    hdr[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    hdr[10..12].copy_from_slice(&[0, 0]);
    hdr.extend_from_slice(&options);
    let sum = ipv4_checksum(&hdr);
    hdr[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&hdr);
    f.extend_from_slice(udp_and_payload);
    f
}

fn ipv4_checksum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = hdr
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn write_frames(frames: &[Vec<u8>]) -> PathBuf {
    let path = std::env::temp_dir().join(xroce::netns::unique_name("xroce-frames-"));
    let mut f = std::fs::File::create(&path).unwrap();
    for fr in frames {
        writeln!(f, "{}", hex(fr)).unwrap();
    }
    path
}

// ---------------------------------------------------------------------------------------
// Child processes

fn parse_stats(line: &str) -> std::collections::HashMap<String, u64> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn receive_all(
    link: &VethLink,
    frames: Vec<Vec<u8>>,
    inject_with: &str,
    extra: &[(&str, String)],
) -> (Vec<Vec<u8>>, String) {
    let mut env = vec![
        ("IFNAME", link.b_if.clone()),
        ("COUNT", frames.len().to_string()),
        ("TIMEOUT_MS", "5000".to_string()),
    ];
    env.extend(extra.iter().cloned());
    let mut rx = Helper::spawn(&link.b, "xdp-recv", &env);
    let ready = rx.expect("READY", Duration::from_secs(20));
    let file = write_frames(&frames);
    let tx = Helper::spawn(
        &link.a,
        inject_with,
        &[
            ("IFNAME", link.a_if.clone()),
            ("FRAMES", file.display().to_string()),
        ],
    );
    let mut tx = tx;
    tx.expect("SENT", Duration::from_secs(20));
    tx.wait();
    let _ = std::fs::remove_file(&file);
    let mut got = Vec::new();
    let stats = loop {
        let line = rx.expect("", Duration::from_secs(20));
        if let Some(h) = line.strip_prefix("FRAME ") {
            got.push(unhex(h));
        } else if line.starts_with("STATS") {
            break line;
        }
    };
    rx.expect("DONE", Duration::from_secs(5));
    rx.wait();
    (got, stats + " " + &ready)
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
fn roce_frames_cross_byte_for_byte_between_two_xdp_drivers() {
    if !common::privileged_or_skip("roce_frames_cross_byte_for_byte_between_two_xdp_drivers") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let mut frames = Vec::new();
    for (i, len) in [0usize, 1, 2, 3, 64, 256, 1024, 1400]
        .into_iter()
        .enumerate()
    {
        frames.push(ipv4_frame(
            &link,
            Vlan::None,
            ROCE_PORT,
            &roce_payload(i as u8, len),
        ));
    }
    frames.push(ipv6_frame(&link, &roce_payload(0x60, 1024)));
    frames.push(ipv4_with_options_frame(&link, &roce_payload(0x40, 100)));
    let (got, stats) = receive_all(&link, frames.clone(), "xdp-send", &[]);
    assert_eq!(got.len(), frames.len(), "stats: {stats}");
    for (i, (g, f)) in got.iter().zip(&frames).enumerate() {
        assert_eq!(g, f, "frame {i} differs");
    }
    let s = parse_stats(&stats);
    assert_eq!(s["redirected"], frames.len() as u64, "{stats}");
    assert_eq!(s["malformed"], 0, "{stats}");
}

#[test]
fn frames_written_into_the_umem_with_send_with_cross_byte_for_byte_in_order() {
    if !common::privileged_or_skip(
        "frames_written_into_the_umem_with_send_with_cross_byte_for_byte_in_order",
    ) {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let mut frames: Vec<Vec<u8>> = [0usize, 1, 3, 64, 1024, 1400]
        .into_iter()
        .enumerate()
        .map(|(i, len)| ipv4_frame(&link, Vlan::None, ROCE_PORT, &roce_payload(i as u8, len)))
        .collect();
    // More frames than one kick moves, each with its sequence number.
    frames.extend((0..1000u32).map(|i| {
        let mut p = roce_payload(i as u8, 100);
        p[8..12].copy_from_slice(&i.to_be_bytes());
        ipv4_frame(&link, Vlan::None, ROCE_PORT, &p)
    }));
    let (got, stats) = receive_all(&link, frames.clone(), "xdp-send-with", &[]);
    assert_eq!(got.len(), frames.len(), "{stats}");
    assert!(got == frames, "frames differ or are reordered; {stats}");
}

#[test]
fn a_burst_larger_than_one_kick_arrives_complete_and_in_order() {
    if !common::privileged_or_skip("a_burst_larger_than_one_kick_arrives_complete_and_in_order") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    // 1000 frames in one flush: copy-mode sendto() moves at most 32 per call.
    let frames: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| {
            let mut p = roce_payload(i as u8, 200);
            p[8..12].copy_from_slice(&i.to_be_bytes()); // PSN-ish sequence number
            ipv4_frame(&link, Vlan::None, ROCE_PORT, &p)
        })
        .collect();
    let (got, stats) = receive_all(&link, frames.clone(), "xdp-send", &[]);
    assert_eq!(got.len(), frames.len(), "{stats}");
    assert!(got == frames, "frames differ or are reordered; {stats}");
}

#[test]
fn vlan_tagged_and_malformed_frames_are_steered_and_counted() {
    if !common::privileged_or_skip("vlan_tagged_and_malformed_frames_are_steered_and_counted") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let roce = vec![
        ipv4_frame(&link, Vlan::Single(100), ROCE_PORT, &roce_payload(1, 200)),
        ipv4_frame(&link, Vlan::None, ROCE_PORT, &roce_payload(3, 10)),
    ];
    let mut all = roce.clone();
    // QinQ RoCE is left to the kernel (see `xroce_takes_exactly_what_its_parser_accepts`).
    all.push(ipv4_frame(
        &link,
        Vlan::Double(200, 300),
        ROCE_PORT,
        &roce_payload(2, 300),
    ));
    // Not RoCE: another UDP port, then a truncated IPv4 header, then a fragment to 4791.
    all.insert(1, ipv4_frame(&link, Vlan::None, 4792, &roce_payload(9, 20)));
    let mut truncated = ipv4_frame(&link, Vlan::None, ROCE_PORT, &roce_payload(8, 20));
    truncated.truncate(14 + 12);
    all.insert(2, truncated);
    let mut fragment = ipv4_frame(&link, Vlan::None, ROCE_PORT, &roce_payload(7, 20));
    fragment[14 + 6] |= 0x20; // More Fragments
    all.insert(3, fragment);
    // The receiver waits for the 3 RoCE frames; the others must not arrive.
    let file_frames = all;
    let (got, stats) = receive_all_expecting(&link, file_frames, roce.len());
    assert_eq!(
        got, roce,
        "exactly the RoCE frames arrive, in order; stats {stats}"
    );
    let s = parse_stats(&stats);
    assert_eq!(s["redirected"], 2, "{stats}");
    assert_eq!(s["unsupported"], 1, "{stats}");
    assert!(s["malformed"] >= 1, "{stats}");
    assert_eq!(
        s["seen"],
        s["redirected"] + s["passed"] + s["malformed"] + s["no_socket"] + s["unsupported"],
        "every frame is counted exactly once: {stats}"
    );
    assert!(s["passed"] >= 2, "{stats}");
}

fn receive_all_expecting(
    link: &VethLink,
    frames: Vec<Vec<u8>>,
    expect: usize,
) -> (Vec<Vec<u8>>, String) {
    let mut env = vec![
        ("IFNAME", link.b_if.clone()),
        ("COUNT", expect.to_string()),
        ("TIMEOUT_MS", "5000".to_string()),
    ];
    env.push(("LINGER_MS", "300".to_string()));
    receive_with(link, env, frames)
}

/// Starts `xdp-recv` with `env` on link.b, injects `frames` from link.a through AF_PACKET,
/// and returns every line the receiver printed (FRAME, KERNEL) and its STATS line.
fn receive_with(
    link: &VethLink,
    env: Vec<(&str, String)>,
    frames: Vec<Vec<u8>>,
) -> (Vec<Vec<u8>>, String) {
    let (got, _, stats) = receive_with_tap(link, env, frames);
    (got, stats)
}

fn receive_with_tap(
    link: &VethLink,
    env: Vec<(&str, String)>,
    frames: Vec<Vec<u8>>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, String) {
    let mut rx = Helper::spawn(&link.b, "xdp-recv", &env);
    rx.expect("READY", Duration::from_secs(20));
    let file = write_frames(&frames);
    let mut tx = Helper::spawn(
        &link.a,
        "packet-send",
        &[
            ("IFNAME", link.a_if.clone()),
            ("FRAMES", file.display().to_string()),
        ],
    );
    tx.expect("SENT", Duration::from_secs(20));
    tx.wait();
    let _ = std::fs::remove_file(&file);
    let mut got = Vec::new();
    let mut kernel = Vec::new();
    let stats = loop {
        let line = rx.expect("", Duration::from_secs(20));
        if let Some(h) = line.strip_prefix("FRAME ") {
            got.push(unhex(h));
        } else if let Some(h) = line.strip_prefix("KERNEL ") {
            kernel.push(unhex(h));
        } else if line.starts_with("STATS") {
            break line;
        }
    };
    rx.wait();
    (got, kernel, stats)
}

// ---------------------------------------------------------------------------------------
// What the XDP program steers, against what the parser accepts

/// A real RoCEv2 RC SEND ONLY from link.a to link.b with a valid ICRC, its payload marked
/// `XROCE-ID<id>` so it can be told apart wherever it lands.
fn marked_roce(link: &VethLink, v6: bool, id: u8) -> Vec<u8> {
    use xroce::wire::{EthRepr, IpRepr};
    let mut payload = b"XROCE-ID".to_vec();
    payload.push(id);
    payload.resize(40, 0x5a);
    let eth = EthRepr {
        dst: link.b_mac,
        src: link.a_mac,
        vlan: None,
    };
    let ip = if v6 {
        IpRepr::V6 {
            src: link.a_ip6.unwrap(),
            dst: link.b_ip6.unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    } else {
        IpRepr::V4 {
            src: link.a_ip,
            dst: link.b_ip,
            tos: 0,
            ttl: 64,
            ident: u16::from(id),
            dont_fragment: true,
        }
    };
    roce::rc_send_only(eth, ip, 0xc003, &payload)
}

/// The marker id a frame carries, if any.
fn marker(frame: &[u8]) -> Option<u8> {
    let at = frame.windows(8).position(|w| w == b"XROCE-ID")?;
    frame.get(at + 8).copied()
}

/// Inserts VLAN tags (TPID, TCI) after the MAC addresses; the ICRC does not cover L2.
fn with_tags(frame: &[u8], tags: &[(u16, u16)]) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    for (tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&frame[12..]);
    f
}

/// Inserts IPv4 options into an untagged IPv4 frame, fixing IHL, total length, header
/// checksum and the ICRC (which covers the options).
fn with_ipv4_options(frame: &[u8], options: &[u8]) -> Vec<u8> {
    let mut f = frame[..34].to_vec();
    f.extend_from_slice(options);
    f.extend_from_slice(&frame[34..]);
    let hl = 20 + options.len();
    f[14] = 0x40 | (hl / 4) as u8;
    let total = u16::from_be_bytes([f[16], f[17]]) + options.len() as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let ck = ipv4_checksum(&f[14..14 + hl]);
    f[24..26].copy_from_slice(&ck.to_be_bytes());
    let icrc_at = f.len() - 4;
    let crc = xroce::wire::icrc_ipv4(&f[14..14 + hl], &f[14 + hl..icrc_at]);
    f[icrc_at..].copy_from_slice(&crc.to_le_bytes());
    f
}

/// Inserts IPv6 extension headers (`first` is the first one's type) into an untagged IPv6
/// frame; with `dst_port`, the UDP destination port is changed too.
fn with_ipv6_ext(frame: &[u8], first: u8, ext: &[u8], dst_port: Option<u16>) -> Vec<u8> {
    let mut f = frame[..54].to_vec();
    f.extend_from_slice(ext);
    f.extend_from_slice(&frame[54..]);
    let plen = u16::from_be_bytes([f[18], f[19]]) + ext.len() as u16;
    f[18..20].copy_from_slice(&plen.to_be_bytes());
    f[20] = first;
    if let Some(p) = dst_port {
        let udp = 54 + ext.len();
        f[udp + 2..udp + 4].copy_from_slice(&p.to_be_bytes());
    }
    f
}

#[test]
fn xroce_takes_exactly_what_its_parser_accepts() {
    use xroce::wire::{parse_frame, parse_frame_verified, WireError};
    if !common::privileged_or_skip("xroce_takes_exactly_what_its_parser_accepts") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let v4 = |id| marked_roce(&link, false, id);
    let v6 = |id| marked_roce(&link, true, id);
    let router_alert = [0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00];
    let hbh_to_udp = [17, 0, 0x01, 0x04, 0, 0, 0, 0]; // hop-by-hop, PadN
                                                      // (frame, taken by xroce, counted by the XDP program as unsupported RoCEv2)
    let cases: Vec<(&str, Vec<u8>, bool, bool)> = vec![
        ("IPv4", v4(1), true, false),
        (
            "IPv4 + 802.1Q",
            with_tags(&v4(2), &[(0x8100, 100)]),
            true,
            false,
        ),
        (
            "IPv4 + 8 bytes of options",
            with_ipv4_options(&v4(3), &router_alert),
            true,
            false,
        ),
        (
            "IPv4 + 40 bytes of options",
            with_ipv4_options(&v4(4), &[1; 40]),
            true,
            false,
        ),
        ("IPv6", v6(5), true, false),
        (
            "QinQ 802.1ad/802.1Q",
            with_tags(&v4(6), &[(0x88a8, 200), (0x8100, 300)]),
            false,
            true,
        ),
        (
            "two 802.1Q tags",
            with_tags(&v4(7), &[(0x8100, 200), (0x8100, 300)]),
            false,
            true,
        ),
        (
            "802.1ad tag alone",
            with_tags(&v4(8), &[(0x88a8, 200)]),
            false,
            true,
        ),
        (
            "IPv6 + hop-by-hop",
            with_ipv6_ext(&v6(9), 0, &hbh_to_udp, None),
            false,
            true,
        ),
        (
            "IPv6 + dest options",
            with_ipv6_ext(&v6(10), 60, &hbh_to_udp, None),
            false,
            true,
        ),
        (
            "IPv6 + hop-by-hop to UDP 4792",
            with_ipv6_ext(&v6(11), 0, &hbh_to_udp, Some(4792)),
            false,
            false,
        ),
    ];
    // The parser's side of the agreement, on the very bytes sent.
    for (name, f, taken, _) in &cases {
        let parsed = parse_frame_verified(f);
        if *taken {
            assert!(parsed.is_ok(), "{name}: {parsed:?}");
        } else {
            assert!(
                matches!(
                    parse_frame(f),
                    Err(WireError::StackedVlan { .. }
                        | WireError::ServiceVlanTag { .. }
                        | WireError::Ipv6ExtensionHeaders { .. }
                        | WireError::NotRoce { .. })
                ),
                "{name}: {:?}",
                parse_frame(f)
            );
        }
    }
    let taken = cases.iter().filter(|c| c.2).count();
    let env = vec![
        ("IFNAME", link.b_if.clone()),
        ("COUNT", taken.to_string()),
        ("TIMEOUT_MS", "5000".to_string()),
        ("LINGER_MS", "500".to_string()),
        ("TAP", "1".to_string()),
    ];
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.1.clone()).collect();
    let (got, kernel, stats) = receive_with_tap(&link, env, frames);
    let xdp_ids: Vec<u8> = got.iter().filter_map(|f| marker(f)).collect();
    let kernel_ids: Vec<u8> = kernel.iter().filter_map(|f| marker(f)).collect();
    for (i, (name, f, taken, _)) in cases.iter().enumerate() {
        let id = i as u8 + 1;
        assert_eq!(marker(f), Some(id));
        let (in_xdp, in_kernel) = (xdp_ids.contains(&id), kernel_ids.contains(&id));
        assert_eq!(
            (in_xdp, in_kernel),
            (*taken, !*taken),
            "{name}: (AF_XDP, kernel) got it; stats {stats}"
        );
    }
    // What AF_XDP got is byte for byte what was sent, and what the engine would accept.
    for g in &got {
        let sent = &cases[usize::from(marker(g).unwrap()) - 1].1;
        assert_eq!(g, sent);
        assert!(parse_frame_verified(g).is_ok());
    }
    let s = parse_stats(&stats);
    assert_eq!(s["redirected"], taken as u64, "{stats}");
    let unsupported = cases.iter().filter(|c| c.3).count() as u64;
    assert_eq!(s["unsupported"], unsupported, "{stats}");
    assert_eq!(s["malformed"], 0, "{stats}");
}

#[test]
fn jumbo_link_carries_path_mtu_4096_frames_in_generic_mode() {
    if !common::privileged_or_skip("jumbo_link_carries_path_mtu_4096_frames_in_generic_mode") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        mtu: 9000,
        ..LinkConfig::default()
    })
    .expect("veth link");
    // A path-MTU-4096 RDMA WRITE ONLY: BTH + RETH + 4096 bytes + ICRC, over IPv4 and IPv6.
    let mut p = roce_payload(5, 4096 + 16);
    p[0] = 0x0a;
    let frames = vec![
        ipv4_frame(&link, Vlan::None, ROCE_PORT, &p),
        ipv6_frame(&link, &p),
    ];
    assert!(frames[1].len() > 4096 - 256, "does not fit a 4096 chunk");
    let (got, stats) = receive_all(&link, frames.clone(), "xdp-send", &[]);
    assert_eq!(got, frames, "stats {stats}");
    // veth refuses native XDP above a page-sized MTU, so Auto fell back to generic, and the
    // ~4.2 KB frames crossed as two chunks each.
    assert!(
        stats.contains("Some(\"generic\") multi_buffer=true"),
        "{stats}"
    );
    assert_eq!(parse_stats(&stats)["sock_rx_dropped"], 0, "{stats}");
}

#[test]
fn kernel_traffic_still_flows_and_program_detaches_when_process_dies() {
    if !common::privileged_or_skip(
        "kernel_traffic_still_flows_and_program_detaches_when_process_dies",
    ) {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    assert!(!link.b.has_xdp(&link.b_if).unwrap());
    let mut rx = Helper::spawn(
        &link.b,
        "xdp-recv",
        &[
            ("IFNAME", link.b_if.clone()),
            ("COUNT", "1000000".into()),
            ("TIMEOUT_MS", "60000".into()),
        ],
    );
    rx.expect("READY", Duration::from_secs(20));
    assert!(link.b.has_xdp(&link.b_if).unwrap(), "program attached");

    // ICMP, both address families.
    for dst in [link.b_ip.to_string(), link.b_ip6.unwrap().to_string()] {
        let out = link
            .a
            .command("ping")
            .args(["-c2", "-i0.2", "-W2", &dst])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ping {dst}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // A TCP connection into the namespace with the XDP program.
    let mut server = Helper::spawn(&link.b, "tcp-server", &[("PORT", "18515".into())]);
    server.expect("LISTENING", Duration::from_secs(20));
    let mut client = Helper::spawn(
        &link.a,
        "tcp-client",
        &[("ADDR", format!("{}:18515", link.b_ip))],
    );
    client.expect("TCP-OK", Duration::from_secs(20));
    server.expect("TCP-SERVED", Duration::from_secs(5));

    // SIGKILL: no destructor runs; the kernel must still drop the link with the process.
    rx.child.kill().unwrap();
    rx.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while link.b.has_xdp(&link.b_if).unwrap() {
        assert!(
            Instant::now() < deadline,
            "XDP program still attached after the process died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And a new driver can take the interface right away (bind EBUSY is retried).
    let mut again = Helper::spawn(&link.b, "xdp-open", &[("IFNAME", link.b_if.clone())]);
    let line = again.expect("OPEN", Duration::from_secs(20));
    assert!(line.starts_with("OPEN-OK"), "{line}");
}

#[test]
fn clear_errors_for_missing_interface_other_program_and_no_privileges() {
    if !common::privileged_or_skip(
        "clear_errors_for_missing_interface_other_program_and_no_privileges",
    ) {
        return;
    }
    // Missing interface: no privileges needed to find that out.
    match XdpDriver::open(&XdpConfig::new("xroce-none0")) {
        Err(DriverError::InterfaceMissing { ifname }) => assert_eq!(ifname, "xroce-none0"),
        other => panic!("expected InterfaceMissing, got {other:?}"),
    }

    let link = VethLink::create(&LinkConfig::default()).expect("veth link");

    // Interface down.
    link.b
        .ip(&["link", "set", "dev", &link.b_if, "down"])
        .unwrap();
    let mut h = Helper::spawn(&link.b, "xdp-open", &[("IFNAME", link.b_if.clone())]);
    let line = h.expect("OPEN", Duration::from_secs(20));
    assert!(
        line.contains("InterfaceDown") && line.contains("ip link set dev"),
        "{line}"
    );
    link.b
        .ip(&["link", "set", "dev", &link.b_if, "up"])
        .unwrap();

    // Not root: the same open as user nobody.
    let mut cmd = link.b.command("setpriv");
    cmd.args(common::SETPRIV_AS_NOBODY)
        .arg(std::env::current_exe().unwrap());
    let mut h = Helper::spawn_cmd(cmd, "xdp-open", &[("IFNAME", link.b_if.clone())]);
    let line = h.expect("OPEN", Duration::from_secs(20));
    assert!(
        line.contains("NotPermitted") && line.contains("CAP_NET_ADMIN"),
        "{line}"
    );

    // A first xroce driver holds the interface: the second says another xroce uses it (by
    // the attached program's name), with its id, and gives no advice that would detach it.
    let mut first = Helper::spawn(
        &link.b,
        "xdp-recv",
        &[
            ("IFNAME", link.b_if.clone()),
            ("COUNT", "1000".into()),
            ("TIMEOUT_MS", "30000".into()),
        ],
    );
    first.expect("READY", Duration::from_secs(20));
    let mut second = Helper::spawn(&link.b, "xdp-open", &[("IFNAME", link.b_if.clone())]);
    let line = second.expect("OPEN", Duration::from_secs(20));
    assert!(
        line.contains("XroceAlreadyAttached")
            && line.contains("another xroce process already uses")
            && line.contains("(its XDP program, id "),
        "{line}"
    );
    assert!(
        !line.contains("xdp off"),
        "advice that breaks the first: {line}"
    );
    assert!(
        !line.contains("(id 0)"),
        "the attached program's id is reported: {line}"
    );
    drop(first);
}

#[test]
fn zero_copy_on_veth_falls_back_or_is_refused_clearly() {
    if !common::privileged_or_skip("zero_copy_on_veth_falls_back_or_is_refused_clearly") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let open = |zc: &str| {
        let mut h = Helper::spawn(
            &link.b,
            "xdp-open",
            &[("IFNAME", link.b_if.clone()), ("ZERO_COPY", zc.into())],
        );
        let line = h.expect("OPEN", Duration::from_secs(20));
        h.wait();
        line
    };
    let line = open("require");
    assert!(
        line.contains("ZeroCopyUnsupported") && line.contains("use copy mode"),
        "{line}"
    );
    let line = open("try");
    assert!(line.starts_with("OPEN-OK xdp-copy"), "{line}");
}

#[test]
fn every_receive_queue_gets_a_socket() {
    if !common::privileged_or_skip("every_receive_queue_gets_a_socket") {
        return;
    }
    // MTU 9000 and 4 KiB datagrams: every socket, not only the first, must join
    // multi-buffer frames (the later ones inherit XDP_USE_SG through the shared UMEM).
    let link = VethLink::create(&LinkConfig {
        queues: 4,
        mtu: 9000,
        ..LinkConfig::default()
    })
    .expect("veth link");
    link.add_static_neighbours().unwrap();
    let count = 64;
    let run = |all_queues: &str| {
        let mut rx = Helper::spawn(
            &link.b,
            "xdp-recv",
            &[
                ("IFNAME", link.b_if.clone()),
                ("COUNT", count.to_string()),
                ("TIMEOUT_MS", "3000".into()),
                ("ALL_QUEUES", all_queues.into()),
            ],
        );
        let ready = rx.expect("READY", Duration::from_secs(20));
        let mut tx = Helper::spawn(
            &link.a,
            "udp-burst",
            &[
                ("ADDR", format!("{}:4791", link.b_ip)),
                ("COUNT", count.to_string()),
                ("SIZE", "4100".into()),
            ],
        );
        tx.expect("SENT", Duration::from_secs(20));
        tx.wait();
        let mut got = 0;
        let stats = loop {
            let line = rx.expect("", Duration::from_secs(20));
            if let Some(h) = line.strip_prefix("FRAME ") {
                assert_eq!(
                    h.len() / 2,
                    14 + 20 + 8 + 12 + 4100 + 4,
                    "whole frame joined"
                );
                got += 1;
            } else if line.starts_with("STATS") {
                break line;
            }
        };
        rx.wait();
        (ready, got, parse_stats(&stats), stats)
    };
    let (ready, got, s, stats) = run("1");
    assert!(ready.contains("queues=[0, 1, 2, 3]"), "{ready}");
    assert_eq!(got, count, "{stats}");
    assert_eq!(s["no_socket"], 0, "{stats}");
    // The same traffic with only queue 0 bound: flows hashed elsewhere miss the socket,
    // which shows the flows really were spread over several queues.
    let (ready, got, s, stats) = run("0");
    assert!(ready.contains("queues=[0]"), "{ready}");
    assert!(
        s["no_socket"] > 0,
        "all {count} flows landed on queue 0? {stats}"
    );
    assert_eq!(got as u64 + s["no_socket"], count as u64, "{stats}");
}

#[test]
fn generic_attach_mode_works_and_is_reported() {
    if !common::privileged_or_skip("generic_attach_mode_works_and_is_reported") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let frames = vec![ipv4_frame(
        &link,
        Vlan::None,
        ROCE_PORT,
        &roce_payload(1, 500),
    )];
    let (got, stats) = receive_all(
        &link,
        frames.clone(),
        "xdp-send",
        &[("ATTACH", "generic".into())],
    );
    assert_eq!(got, frames, "{stats}");
}

// ---------------------------------------------------------------------------------------
// The helper roles, run in child processes.

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

fn read_frames() -> Vec<Vec<u8>> {
    std::fs::read_to_string(env("FRAMES"))
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(unhex)
        .collect()
}

fn open_from_env() -> Result<XdpDriver, DriverError> {
    let mut cfg = XdpConfig::new(env("IFNAME"));
    cfg.attach = match std::env::var("ATTACH").as_deref() {
        Ok("generic") => AttachMode::Generic,
        Ok("native") => AttachMode::Native,
        _ => AttachMode::Auto,
    };
    cfg.all_queues = std::env::var("ALL_QUEUES").as_deref() != Ok("0");
    cfg.zero_copy = match std::env::var("ZERO_COPY").as_deref() {
        Ok("try") => ZeroCopy::Try,
        Ok("require") => ZeroCopy::Require,
        _ => ZeroCopy::Never,
    };
    XdpDriver::open(&cfg)
}

/// Not a test by itself: the body of the child processes the tests above start.
#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    let out = std::io::stdout();
    let say = |s: String| {
        let mut o = out.lock();
        writeln!(o, "{s}").unwrap();
        o.flush().unwrap();
    };
    match role.as_str() {
        "xdp-open" => match open_from_env() {
            Ok(d) => say(format!(
                "OPEN-OK {} {:?}",
                d.info().mode,
                d.info().xdp_attach
            )),
            Err(e) => say(format!("OPEN-ERR {e:?}: {e}")),
        },
        "xdp-recv" => {
            // With TAP=1, an AF_PACKET socket on the same interface shows what the kernel
            // stack got: XDP_PASS frames reach it, redirected ones do not.
            let tap = (std::env::var("TAP").as_deref() == Ok("1"))
                .then(|| PacketSocket::open(&env("IFNAME")).unwrap());
            let drain_tap = || {
                let Some(tap) = &tap else { return };
                let mut buf = vec![0u8; 16384];
                while let Some((n, dir)) = tap.recv_timeout(&mut buf, Duration::ZERO).unwrap() {
                    if dir == Direction::Incoming {
                        say(format!("KERNEL {}", hex(&buf[..n])));
                    }
                }
            };
            let mut d = match open_from_env() {
                Ok(d) => d,
                Err(e) => return say(format!("ERROR {e:?}: {e}")),
            };
            let info = d.info();
            say(format!(
                "READY {} {:?} multi_buffer={} max_frame={} queues={:?}",
                info.mode,
                info.xdp_attach,
                d.multi_buffer(),
                info.max_frame,
                d.queues()
            ));
            let count: usize = env("COUNT").parse().unwrap();
            let deadline =
                Instant::now() + Duration::from_millis(env("TIMEOUT_MS").parse().unwrap());
            let mut n = 0;
            while n < count && Instant::now() < deadline {
                poll_readable(d.wait_fd().unwrap(), Some(Duration::from_millis(100))).unwrap();
                n += d
                    .recv(64, &mut |f, meta| {
                        assert!(meta.icrc_verifiable);
                        say(format!("FRAME {}", hex(f)));
                    })
                    .unwrap();
            }
            if let Ok(ms) = std::env::var("LINGER_MS") {
                // Catch frames that should not have arrived.
                let until = Instant::now() + Duration::from_millis(ms.parse().unwrap());
                while Instant::now() < until {
                    d.recv(64, &mut |f, _| say(format!("FRAME {}", hex(f))))
                        .unwrap();
                    drain_tap();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            drain_tap();
            let s = d.xdp_stats().unwrap();
            say(format!(
                "STATS seen={} redirected={} passed={} malformed={} no_socket={} \
                 unsupported={} sock_rx_dropped={}",
                s.seen,
                s.redirected,
                s.passed,
                s.malformed,
                s.no_socket,
                s.unsupported,
                s.sock_rx_dropped
            ));
            say("DONE".into());
        }
        "xdp-send" => {
            let mut d = match open_from_env() {
                Ok(d) => d,
                Err(e) => return say(format!("ERROR {e:?}: {e}")),
            };
            let frames = read_frames();
            for f in &frames {
                d.send(f).unwrap();
            }
            d.flush().unwrap();
            say(format!("SENT {}", frames.len()));
        }
        "xdp-send-with" => {
            // Each frame written straight into a UMEM frame, after a writer with nothing to
            // send (its slot must stay free: 1000 frames still fit).
            let mut d = match open_from_env() {
                Ok(d) => d,
                Err(e) => return say(format!("ERROR {e:?}: {e}")),
            };
            assert_eq!(d.send_with_room(), d.frame_size() as usize - 256);
            let frames = read_frames();
            for f in &frames {
                assert_eq!(d.send_with(2048, &mut |_| None).unwrap(), None);
                let mut write = |buf: &mut [u8]| {
                    assert_eq!(buf.len(), 2048);
                    buf[..f.len()].copy_from_slice(f);
                    Some(f.len())
                };
                let sent = match d.send_with(2048, &mut write) {
                    Err(DriverError::TxBusy) => {
                        d.flush().unwrap();
                        d.send_with(2048, &mut write)
                    }
                    other => other,
                };
                assert_eq!(sent.unwrap(), Some(f.len()));
            }
            d.flush().unwrap();
            say(format!("SENT {}", frames.len()));
        }
        "packet-send" => {
            let s = PacketSocket::open(&env("IFNAME")).unwrap();
            let frames = read_frames();
            for f in &frames {
                s.send(f).unwrap();
            }
            say(format!("SENT {}", frames.len()));
        }
        "udp-burst" => {
            // One datagram from each of COUNT sockets: the kernel hashes each flow (ports)
            // to a transmit queue, and veth delivers on the receive queue of that number.
            let dst: std::net::SocketAddr = env("ADDR").parse().unwrap();
            let count: usize = env("COUNT").parse().unwrap();
            for i in 0..count {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                let size: usize = std::env::var("SIZE")
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(64);
                s.send_to(&roce_payload(i as u8, size), dst).unwrap();
            }
            say(format!("SENT {count}"));
        }
        "tcp-server" => {
            let l = std::net::TcpListener::bind(("0.0.0.0", env("PORT").parse::<u16>().unwrap()))
                .unwrap();
            say("LISTENING".into());
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 5];
            std::io::Read::read_exact(&mut c, &mut buf).unwrap();
            c.write_all(&buf).unwrap();
            say("TCP-SERVED".into());
        }
        "tcp-client" => {
            let addr: std::net::SocketAddr = env("ADDR").parse().unwrap();
            let mut c =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            c.write_all(b"hello").unwrap();
            let mut buf = [0u8; 5];
            std::io::Read::read_exact(&mut c, &mut buf).unwrap();
            assert_eq!(&buf, b"hello");
            say("TCP-OK".into());
        }
        other => panic!("unknown helper role {other}"),
    }
}
