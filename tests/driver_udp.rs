//! The UDP socket driver: frames round trip through kernel sockets, and what it puts on the
//! wire carries a correct ICRC (checked on frames captured off a veth, and by the AF_XDP
//! driver receiving them).
mod common;
#[path = "common/packet.rs"]
mod packet;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

#[cfg(feature = "xdp")]
use common::Helper;
use common::{hex, unhex};
use packet::{Direction, PacketSocket};
use xroce::driver::udp::{unique_loopback_v4, UdpConfig, UdpDriver};
#[cfg(feature = "xdp")]
use xroce::driver::xdp::{XdpConfig, XdpDriver};
use xroce::driver::{poll_readable, Driver, DriverError};
#[cfg(feature = "xdp")]
use xroce::netns::{LinkConfig, VethLink};
use xroce::wire::{
    parse_frame, DethRepr, EthRepr, FrameRepr, IpRepr, Opcode, PacketRepr, Psn, RethRepr,
};

/// A frame as the engine would build it, with an IP ID and UDP source port that the kernel
/// will NOT use, so the driver has to rewrite them and recompute the ICRC.
fn engine_frame(src: Ipv4Addr, dst: Ipv4Addr, dst_mac: [u8; 6], kind: u8, data: &[u8]) -> Vec<u8> {
    let mut roce = match kind {
        0 => PacketRepr::new(Opcode::RC_SEND_ONLY, 0x000123),
        1 => {
            let mut p = PacketRepr::new(Opcode::RC_RDMA_WRITE_ONLY, 0x000456);
            p.reth = Some(RethRepr {
                va: 0x1000_2000_3000,
                rkey: 0xabcd,
                dma_len: data.len() as u32,
            });
            p
        }
        _ => {
            let mut p = PacketRepr::new(Opcode::UD_SEND_ONLY, 0x000789);
            p.deth = Some(DethRepr {
                qkey: 0x1111_2222,
                src_qp: 0x33,
            });
            p
        }
    };
    roce.bth.psn = Psn::new(0x10 + kind as u32);
    roce.bth.ack_req = true;
    roce.payload = data;
    let f = FrameRepr {
        eth: EthRepr {
            dst: dst_mac,
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
        },
        ip: IpRepr::V4 {
            src,
            dst,
            tos: 0,
            ttl: 64,
            ident: 0x4242,
            dont_fragment: false,
        },
        udp_src_port: 0xc0de,
        roce,
    };
    let mut buf = vec![0; f.buffer_len()];
    f.emit(&mut buf).unwrap();
    buf
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

fn recv_one(d: &mut UdpDriver, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut got = None;
    while got.is_none() && Instant::now() < deadline {
        poll_readable(d.wait_fd().unwrap(), Some(Duration::from_millis(50))).unwrap();
        d.recv(1, &mut |f, meta| {
            assert!(
                !meta.icrc_verifiable,
                "the UDP driver cannot vouch for the ICRC"
            );
            got = Some(f.to_vec());
        })
        .unwrap();
    }
    got
}

#[test]
fn frames_round_trip_over_loopback_without_privileges() {
    let (a_ip, b_ip) = (unique_loopback_v4(1), unique_loopback_v4(2));
    let mut a = UdpDriver::open(&UdpConfig::new("lo", IpAddr::V4(a_ip))).unwrap();
    let mut b = UdpDriver::open(&UdpConfig::new("lo", IpAddr::V4(b_ip))).unwrap();
    assert!(!a.info().icrc_verifiable);
    assert_eq!(a.info().mode.as_str(), "udp");
    for (kind, len) in [(0u8, 0usize), (0, 1), (1, 1024), (2, 300), (1, 4096)] {
        let data = payload(len, kind);
        let sent = engine_frame(a_ip, b_ip, [0; 6], kind, &data);
        a.send(&sent).unwrap();
        a.flush().unwrap();
        let got = recv_one(&mut b, Duration::from_secs(2)).expect("frame arrives");
        let sent_p = parse_frame(&sent).unwrap();
        let got_p = parse_frame(&got).unwrap();
        assert_eq!(got_p.repr.roce, sent_p.repr.roce, "RoCE packet unchanged");
        match got_p.repr.ip {
            IpRepr::V4 { src, dst, .. } => assert_eq!((src, dst), (a_ip, b_ip)),
            other => panic!("{other:?}"),
        }
        // The synthesized header is what the kernel sent (DF, ID 0, source port 4791), so
        // the sender's recomputed ICRC verifies against it.
        assert_eq!(got_p.repr.udp_src_port, 4791);
        assert!(
            got_p.icrc_ok(),
            "kind {kind} len {len}: ICRC recomputed for ID 0/DF/4791"
        );
        // And the engine's original ICRC would not have (ident 0x4242, port 0xc0de).
        assert_ne!(got_p.icrc_received, sent_p.icrc_received);
    }
    assert_eq!(a.stats().sent, 5);
    assert_eq!(b.stats().received, 5);
}

#[test]
fn bad_frames_and_datagrams_are_refused_or_counted() {
    let (a_ip, b_ip) = (unique_loopback_v4(3), unique_loopback_v4(4));
    let mut a = UdpDriver::open(&UdpConfig::new("lo", IpAddr::V4(a_ip))).unwrap();
    let mut b = UdpDriver::open(&UdpConfig::new("lo", IpAddr::V4(b_ip))).unwrap();
    // Not RoCE at all.
    assert!(matches!(
        a.send(&[0u8; 60]),
        Err(DriverError::InvalidFrame { .. })
    ));
    // A RoCE frame with its last bytes cut off.
    let mut f = engine_frame(a_ip, b_ip, [0; 6], 0, &payload(100, 1));
    f.truncate(f.len() - 30);
    assert!(matches!(a.send(&f), Err(DriverError::InvalidFrame { .. })));
    assert_eq!(a.stats().send_invalid, 2);
    assert_eq!(a.stats().sent, 0);
    // Runt datagrams to B's port are counted and dropped, never delivered.
    let raw = UdpSocket::bind((a_ip, 0)).unwrap();
    raw.send_to(b"tiny", (b_ip, 4791)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let n = b.recv(16, &mut |_, _| panic!("runt delivered")).unwrap();
    assert_eq!(n, 0);
    assert_eq!(b.stats().recv_runt, 1);
    // The same address and port twice: a clear error naming the cause.
    let err = UdpDriver::open(&UdpConfig::new("lo", IpAddr::V4(a_ip))).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("another RoCE endpoint"), "{text}");
    // An interface that does not exist.
    assert!(matches!(
        UdpDriver::open(&UdpConfig::new("xroce-none1", IpAddr::V4(a_ip))),
        Err(DriverError::InterfaceMissing { .. })
    ));
}

// The receiving end is the AF_XDP driver, which exists only with the `xdp` feature.
#[cfg(feature = "xdp")]
#[test]
fn icrc_on_the_wire_is_right_and_interoperates_with_the_xdp_driver() {
    if !common::privileged_or_skip(
        "icrc_on_the_wire_is_right_and_interoperates_with_the_xdp_driver",
    ) {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let sizes = [0usize, 17, 1024, 1400];

    // 1. UDP driver in A -> capture + UDP driver in B: the captured frames verify.
    let mut b = Helper::spawn(
        &link.b,
        "udp-capture",
        &[
            ("IFNAME", link.b_if.clone()),
            ("LOCAL_IP", link.b_ip.to_string()),
            ("COUNT", sizes.len().to_string()),
        ],
    );
    b.expect("READY", Duration::from_secs(20));
    let mut a = Helper::spawn(
        &link.a,
        "udp-send",
        &[
            ("IFNAME", link.a_if.clone()),
            ("LOCAL_IP", link.a_ip.to_string()),
            ("PEER_IP", link.b_ip.to_string()),
            ("PEER_MAC", hex(&link.b_mac)),
            (
                "SIZES",
                sizes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ],
    );
    a.expect("SENT", Duration::from_secs(20));
    let mut captured = Vec::new();
    let mut delivered = 0;
    loop {
        let line = b.expect("", Duration::from_secs(20));
        if let Some(h) = line.strip_prefix("WIRE ") {
            captured.push(unhex(h));
        } else if line.starts_with("DELIVERED") {
            delivered += 1;
        } else if line.starts_with("DONE") {
            break;
        }
    }
    a.wait();
    b.wait();
    assert_eq!(captured.len(), sizes.len());
    assert_eq!(
        delivered,
        sizes.len(),
        "the kernel socket in B got every datagram"
    );
    for (frame, &len) in captured.iter().zip(&sizes) {
        let p = parse_frame(frame).expect("a RoCEv2 frame on the wire");
        assert!(
            p.icrc_ok(),
            "len {len}: wire ICRC {:#x}, computed {:#x}",
            p.icrc_received,
            p.icrc_computed
        );
        match p.repr.ip {
            IpRepr::V4 {
                src,
                dst,
                ident,
                dont_fragment,
                ..
            } => {
                assert_eq!((src, dst), (link.a_ip, link.b_ip));
                assert_eq!(ident, 0, "unconnected DF socket sends IP ID 0");
                assert!(dont_fragment);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.repr.udp_src_port, 4791);
        assert_eq!(p.repr.roce.payload, &payload(len, 0)[..]);
    }

    // 2. UDP driver in A -> AF_XDP driver in B (the XDP side checks ICRCs), and B replies
    //    over AF_XDP to A's UDP socket.
    let mut b = Helper::spawn(
        &link.b,
        "xdp-echo",
        &[
            ("IFNAME", link.b_if.clone()),
            ("COUNT", sizes.len().to_string()),
        ],
    );
    b.expect("READY", Duration::from_secs(20));
    let mut a = Helper::spawn(
        &link.a,
        "udp-send",
        &[
            ("IFNAME", link.a_if.clone()),
            ("LOCAL_IP", link.a_ip.to_string()),
            ("PEER_IP", link.b_ip.to_string()),
            ("PEER_MAC", hex(&link.b_mac)),
            (
                "SIZES",
                sizes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("AWAIT_REPLIES", "1".into()),
        ],
    );
    for _ in &sizes {
        let line = b.expect("XDP-GOT", Duration::from_secs(20));
        assert!(line.ends_with("icrc_ok=true"), "{line}");
    }
    let line = a.expect("REPLIES", Duration::from_secs(20));
    assert_eq!(line, format!("REPLIES {} ok", sizes.len()));
    a.wait();
    b.wait();
}

// ---------------------------------------------------------------------------------------
// Helper roles (child processes).

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    let say = |s: String| {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{s}").unwrap();
        o.flush().unwrap();
    };
    match role.as_str() {
        "udp-send" => {
            let local: Ipv4Addr = env("LOCAL_IP").parse().unwrap();
            let peer: Ipv4Addr = env("PEER_IP").parse().unwrap();
            let mac: [u8; 6] = unhex(&env("PEER_MAC")).try_into().unwrap();
            let mut d = UdpDriver::open(&UdpConfig::new(env("IFNAME"), IpAddr::V4(local))).unwrap();
            let sizes: Vec<usize> = env("SIZES")
                .split(',')
                .map(|s| s.parse().unwrap())
                .collect();
            for &len in &sizes {
                d.send(&engine_frame(local, peer, mac, 0, &payload(len, 0)))
                    .unwrap();
            }
            d.flush().unwrap();
            say(format!("SENT {}", sizes.len()));
            if std::env::var("AWAIT_REPLIES").is_ok() {
                let mut ok = 0;
                for &len in &sizes {
                    let f = recv_one(&mut d, Duration::from_secs(10)).expect("reply");
                    let p = parse_frame(&f).unwrap();
                    if p.repr.roce.payload == &payload(len, 0x55)[..] {
                        ok += 1;
                    }
                }
                say(format!("REPLIES {ok} ok"));
            }
        }
        "udp-capture" => {
            let local: Ipv4Addr = env("LOCAL_IP").parse().unwrap();
            let cap = PacketSocket::open(&env("IFNAME")).unwrap();
            let mut d = UdpDriver::open(&UdpConfig::new(env("IFNAME"), IpAddr::V4(local))).unwrap();
            say("READY".into());
            let count: usize = env("COUNT").parse().unwrap();
            let (mut wire, mut delivered) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut buf = vec![0u8; 65536];
            while (wire < count || delivered < count) && Instant::now() < deadline {
                if let Some((n, Direction::Incoming)) = cap
                    .recv_timeout(&mut buf, Duration::from_millis(20))
                    .unwrap()
                {
                    // IPv4 + UDP to 4791 only (skip ARP and anything else).
                    let f = &buf[..n];
                    if n > 42 && f[12..14] == [8, 0] && f[23] == 17 && f[36..38] == [0x12, 0xb7] {
                        say(format!("WIRE {}", hex(f)));
                        wire += 1;
                    }
                }
                delivered += d.recv(16, &mut |_, _| say("DELIVERED".into())).unwrap();
            }
            say("DONE".into());
        }
        #[cfg(feature = "xdp")]
        "xdp-echo" => {
            let mut d = XdpDriver::open(&XdpConfig::new(env("IFNAME"))).unwrap();
            say("READY".into());
            let count: usize = env("COUNT").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(15);
            let mut seen = 0;
            while seen < count && Instant::now() < deadline {
                poll_readable(d.wait_fd().unwrap(), Some(Duration::from_millis(50))).unwrap();
                let mut replies = Vec::new();
                seen += d
                    .recv(16, &mut |f, meta| {
                        assert!(meta.icrc_verifiable);
                        let p = parse_frame(f).unwrap();
                        say(format!("XDP-GOT len={} icrc_ok={}", f.len(), p.icrc_ok()));
                        // Reply to the sender: swap addresses, fresh payload.
                        let IpRepr::V4 { src, dst, .. } = p.repr.ip else {
                            panic!("IPv4 expected")
                        };
                        let data = payload(p.repr.roce.payload.len(), 0x55);
                        replies.push(engine_frame(dst, src, p.repr.eth.src, 0, &data));
                    })
                    .unwrap();
                for r in replies {
                    d.send(&r).unwrap();
                }
                d.flush().unwrap();
            }
            // Let the replies leave before the socket closes.
            std::thread::sleep(Duration::from_millis(200));
        }
        other => panic!("unknown helper role {other}"),
    }
}
