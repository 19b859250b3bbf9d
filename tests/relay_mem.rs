//! Several devices on one "interface" through a relay, over the in-memory link (no root):
//! the relay owns one end of the link, a peer device the other; two client devices, each
//! with its own engine and its own relay connection, talk RC to the peer at the same time
//! and to each other; one going away mid-transfer does not disturb the other; a relay that
//! stops gives its clients an error, not a hang.
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use xroce::driver::mem::{MemDriver, MemLinkConfig};
use xroce::driver::relay::{Relay, RelayDriver, RelayHandle};
use xroce::verbs::*;

const ALL_REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const WAIT: Duration = Duration::from_secs(20);
const HOST: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn host_ip() -> IpAddr {
    [198, 18, 0, 1].into()
}
fn peer_ip() -> IpAddr {
    [198, 18, 0, 2].into()
}

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device, mr_len: usize) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096, None).unwrap();
    let cap = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            cap,
            ..QpInitAttr::rc(&cq, &cq)
        })
        .unwrap();
    let mr = pd.reg_mr(mr_len, ALL_REMOTE).unwrap();
    Side {
        dev: dev.clone(),
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn connect(a: &Side, b: &Side) {
    let ga = a.dev.ipv4_gid_index().unwrap();
    let gb = b.dev.ipv4_gid_index().unwrap();
    let opts = |g: u32, psn: u32| RcOptions {
        sgid_index: g as u8,
        path_mtu: Mtu::Mtu1024,
        sq_psn: psn,
        ..RcOptions::default()
    };
    a.qp.connect_rc(
        &RcPeer {
            qpn: b.qp.qp_num(),
            psn: 0x222,
            gid: b.dev.query_gid(gb).unwrap(),
        },
        &opts(ga, 0x111),
    )
    .unwrap();
    b.qp.connect_rc(
        &RcPeer {
            qpn: a.qp.qp_num(),
            psn: 0x111,
            gid: a.dev.query_gid(ga).unwrap(),
        },
        &opts(gb, 0x222),
    )
    .unwrap();
}

struct Host {
    relay: Option<RelayHandle>,
    name: String,
    peer: Device,
}

fn host(tag: &str) -> Host {
    let name = format!("xroce-relay-test-{tag}-{}", std::process::id());
    let (wire, peer_end, _link) = MemDriver::pair(HOST, PEER, &MemLinkConfig::default()).unwrap();
    let relay = Relay::bind(&name, "mem0", Box::new(wire), vec![host_ip()]).unwrap();
    let peer = Device::with_driver(
        Box::new(peer_end),
        DeviceIdentity {
            name: "peer".into(),
            mac: MacAddr(PEER),
            mtu: 1500,
            addrs: vec![peer_ip()],
        },
        DeviceConfig::default(),
    )
    .unwrap();
    peer.add_static_neighbour(host_ip(), MacAddr(HOST));
    Host {
        relay: Some(relay.spawn()),
        name,
        peer,
    }
}

impl Host {
    fn client(&self) -> Device {
        let driver = RelayDriver::connect_name(&self.name, "mem0").unwrap();
        let dev = Device::with_driver(
            Box::new(driver),
            DeviceIdentity {
                name: "mem0".into(),
                mac: MacAddr(HOST),
                mtu: 1500,
                addrs: vec![host_ip()],
            },
            DeviceConfig::default(),
        )
        .unwrap();
        dev.add_static_neighbour(peer_ip(), MacAddr(PEER));
        dev
    }
    fn relay(&self) -> &RelayHandle {
        self.relay.as_ref().unwrap()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn one(cq: &Cq) -> Wc {
    let wcs = cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs.len(), 1, "no completion within {WAIT:?}");
    wcs[0]
}

fn write_wr(wr_id: u64, from: &Mr, to: &Mr, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: WrOp::Write {
            remote_addr: to.addr(),
            rkey: to.rkey(),
        },
        sg_list: vec![from.sge(0, len).unwrap()],
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// `rounds` WRITEs of `len` bytes from `a` into `b`, each checked byte for byte.
fn writes(a: &Side, b: &Side, len: usize, rounds: u8) {
    for round in 0..rounds {
        let data = pattern(len, round);
        a.mr.write(0, &data).unwrap();
        a.qp.post_send(&write_wr(round as u64, &a.mr, &b.mr, len as u32))
            .unwrap();
        let wc = one(&a.cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let mut got = vec![0; len];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == data, "round {round}: the data differs");
    }
}

#[test]
fn two_clients_talk_rc_to_the_peer_at_once_and_to_each_other() {
    let h = host("both");
    let (c1, c2) = (h.client(), h.client());
    let (a1, a2) = (side(&c1, 1 << 20), side(&c2, 1 << 20));
    let (p1, p2) = (side(&h.peer, 1 << 20), side(&h.peer, 1 << 20));
    // Each client's QPNs carry its slot; the peer's engine numbers as always.
    assert_eq!(a1.qp.qp_num() >> 16, 1, "{:#x}", a1.qp.qp_num());
    assert_eq!(a2.qp.qp_num() >> 16, 2, "{:#x}", a2.qp.qp_num());
    assert!(p1.qp.qp_num() < 0x1_0000);
    assert_eq!(c1.driver_info().mode.as_str(), "relay");
    connect(&a1, &p1);
    connect(&a2, &p2);
    std::thread::scope(|s| {
        s.spawn(|| writes(&a1, &p1, 256 << 10, 8));
        s.spawn(|| writes(&p2, &a2, 256 << 10, 8));
    });
    let moved = h.relay().stats().wire_to_client.load(Ordering::Relaxed);
    // p2 -> a2 alone is 8 x 256 packets of 1 KiB; a1 gets at least one ACK per WRITE.
    assert!(moved >= 8 * 256 + 8, "wire->client {moved}");

    // The two clients of one interface: to an own address with another client's QPN.
    let (b1, b2) = (side(&c1, 1 << 20), side(&c2, 1 << 20));
    connect(&b1, &b2);
    writes(&b1, &b2, 100_000, 4);
    writes(&b2, &b1, 100_000, 4);
    let between = h.relay().stats().client_to_client.load(Ordering::Relaxed);
    assert!(between >= 8 * 98, "client->client {between}");
    assert_eq!(
        h.relay().stats().dropped_no_client.load(Ordering::Relaxed),
        0
    );
}

#[test]
fn a_client_gone_mid_transfer_does_not_disturb_the_other() {
    let h = host("gone");
    let (c1, c2) = (h.client(), h.client());
    let (a1, p1) = (side(&c1, 1 << 20), side(&h.peer, 1 << 20));
    let (a2, p2) = (side(&c2, 4 << 20), side(&h.peer, 4 << 20));
    connect(&a1, &p1);
    connect(&a2, &p2);
    let a2_qpn = a2.qp.qp_num();
    std::thread::scope(|s| {
        s.spawn(|| writes(&a1, &p1, 256 << 10, 20));
        s.spawn(|| {
            // The peer streams READs of a2's memory... and a2's process ends halfway.
            for i in 0..16 {
                p2.qp
                    .post_send(&SendWr {
                        wr_id: i,
                        op: WrOp::Read {
                            remote_addr: a2.mr.addr(),
                            rkey: a2.mr.rkey(),
                        },
                        sg_list: vec![p2.mr.sge(0, 4 << 20).unwrap()],
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    })
                    .unwrap();
            }
            std::thread::sleep(Duration::from_millis(30));
            drop(a2);
            drop(c2);
        });
    });
    let stats = h.relay().stats();
    let end = Instant::now() + WAIT;
    while stats.disconnected.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the relay did not see the client go");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The peer's QP still talks to the dead client's QPN: dropped and counted.
    let wc = one(&p2.cq);
    assert!(a2_qpn >> 16 == 2);
    let _ = wc;
    let end = Instant::now() + WAIT;
    while stats.dropped_no_client.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "no drop counted: {}", stats.summary());
        std::thread::sleep(Duration::from_millis(10));
    }
    // And the first client carries on, and a new one gets the freed slot.
    writes(&a1, &p1, 64 << 10, 4);
    let c3 = h.client();
    let a3 = side(&c3, 1 << 16);
    assert_eq!(a3.qp.qp_num() >> 16, 2);
}

#[test]
fn a_stopped_relay_stops_its_clients_with_an_error() {
    let mut h = host("stop");
    let c1 = h.client();
    let (a1, p1) = (side(&c1, 1 << 16), side(&h.peer, 1 << 16));
    connect(&a1, &p1);
    writes(&a1, &p1, 4096, 2);
    h.relay.take().unwrap().stop().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let err = loop {
        // Whatever the application does next fails once progress has seen the relay go.
        match a1.cq.poll_one() {
            Err(e) => break e,
            Ok(_) => {
                assert!(Instant::now() < end, "no error 5 s after the relay stopped");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    let text = err.to_string();
    assert!(text.contains("relay"), "{text}");
    assert!(c1.stopped_reason().is_some_and(|r| r.contains("relay")));
}
