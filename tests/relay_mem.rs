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

// ---- The RDMA CM behind a relay (issue 28): the relay hands each CM MAD on QP1 to the
// process it is for, as Linux's CM does for the processes of one port.

mod cm {
    use super::*;
    use std::net::SocketAddr;
    use xroce::rdmacm::*;

    fn quick() -> CmConfigRdma {
        CmConfigRdma::with_short_timers()
    }

    /// The next event of `s` but for the end of a time wait (those of earlier connections
    /// come whenever their time is up), which must be `kind`.
    fn expect(s: &CmSide, kind: EventKind) -> RdmaCmEvent {
        loop {
            let e = s.ch.get_event(Some(WAIT)).unwrap();
            if e.kind != EventKind::TimewaitExit {
                assert_eq!(e.kind, kind, "status {}", e.status);
                return e;
            }
        }
    }

    struct CmSide {
        cm: Cm,
        ch: EventChannel,
        pd: Pd,
        cq: Cq,
    }

    fn cm_side(dev: &Device) -> CmSide {
        CmSide {
            cm: Cm::with_config(std::slice::from_ref(dev), quick(), None).unwrap(),
            ch: EventChannel::new().unwrap(),
            pd: dev.alloc_pd().unwrap(),
            cq: dev.create_cq(64, None).unwrap(),
        }
    }

    fn listen(s: &CmSide, port: u16) -> std::result::Result<CmId, RdmaCmError> {
        let id = s.cm.create_id(&s.ch, PortSpace::Tcp).unwrap();
        id.bind_addr(SocketAddr::new([0, 0, 0, 0].into(), port))?;
        id.listen(8)?;
        Ok(id)
    }

    /// `client` sends a REQ to `ip:port`; the returned id waits for the answer.
    fn request(client: &CmSide, ip: IpAddr, port: u16) -> (CmId, Qp) {
        let id = client.cm.create_id(&client.ch, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, SocketAddr::new(ip, port), WAIT)
            .unwrap();
        expect(client, EventKind::AddrResolved);
        id.resolve_route(WAIT).unwrap();
        expect(client, EventKind::RouteResolved);
        let qp = id
            .create_qp(&client.pd, &QpInitAttr::rc(&client.cq, &client.cq))
            .unwrap();
        id.connect(&ConnParam::default()).unwrap();
        (id, qp)
    }

    /// REQ, REP, RTU: `client` connects to the listener of `server` on `port`.
    fn connect(client: &CmSide, server: &CmSide, ip: IpAddr, port: u16) -> (CmId, CmId, Qp, Qp) {
        let (id, cqp) = request(client, ip, port);
        let req = expect(server, EventKind::ConnectRequest);
        let child = req.id.clone();
        let sqp = child
            .create_qp(&server.pd, &QpInitAttr::rc(&server.cq, &server.cq))
            .unwrap();
        child.accept(&ConnParam::default()).unwrap();
        expect(client, EventKind::Established);
        let est = expect(server, EventKind::Established);
        assert_eq!(est.id, child);
        (id, child, cqp, sqp)
    }

    /// No connection event for `s` within 100 ms (its own time waits may end meanwhile).
    fn quiet(s: &CmSide, who: &str) {
        std::thread::sleep(Duration::from_millis(100));
        while let Some(e) = s.ch.try_get_event() {
            assert_eq!(
                e.kind,
                EventKind::TimewaitExit,
                "{who} got an event that is not its own"
            );
        }
    }

    fn send_recv(from: &CmSide, qp: &Qp, to: &CmSide, to_qp: &Qp) {
        let rmr = to.pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
        to_qp
            .post_recv(&RecvWr {
                wr_id: 1,
                sg_list: vec![rmr.sge(0, 64).unwrap()],
            })
            .unwrap();
        let smr = from.pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
        smr.write(0, b"through the relay").unwrap();
        qp.post_send(&SendWr {
            wr_id: 2,
            op: WrOp::Send,
            sg_list: vec![smr.sge(0, 17).unwrap()],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap();
        assert_eq!(one(&from.cq).status, WcStatus::Success);
        assert_eq!(one(&to.cq).status, WcStatus::Success);
        assert_eq!(rmr.to_vec(0, 17).unwrap(), b"through the relay");
    }

    #[test]
    fn two_clients_listen_behind_one_relay_and_a_remote_cm_reaches_each() {
        let h = host("cm");
        let (c1, c2) = (h.client(), h.client());
        let (s1, s2, peer) = (cm_side(&c1), cm_side(&c2), cm_side(&h.peer));
        // Both clients hold QP1 (rdma_bind_addr used to fail with EINVAL here).
        let l1 = listen(&s1, 7001).unwrap();
        let _l2 = listen(&s2, 7002).unwrap();
        // One listener per port on the interface, as on one Linux host.
        match listen(&s2, 7001) {
            Err(e @ RdmaCmError::AddressInUse { .. }) => assert_eq!(e.errno(), libc::EADDRINUSE),
            other => panic!("{other:?}"),
        }

        // The remote CM connects to each: REQ by service id, REP/RTU by comm id.
        let (a1, b1, qa1, qb1) = connect(&peer, &s1, host_ip(), 7001);
        quiet(&s2, "client 2");
        let (a2, b2, qa2, qb2) = connect(&peer, &s2, host_ip(), 7002);
        quiet(&s1, "client 1");
        assert_eq!(qb1.qp_num() >> 16, 1);
        assert_eq!(qb2.qp_num() >> 16, 2);
        send_recv(&peer, &qa1, &s1, &qb1);
        send_recv(&s2, &qb2, &peer, &qa2);

        // DREQ from the remote to client 1, DREP back; DREQ from client 2, DREP to it.
        a1.disconnect().unwrap();
        let e = expect(&s1, EventKind::Disconnected);
        assert_eq!(e.id, b1);
        b1.disconnect().unwrap();
        expect(&peer, EventKind::Disconnected);
        quiet(&s2, "client 2");
        b2.disconnect().unwrap();
        let e = expect(&peer, EventKind::Disconnected);
        assert_eq!(e.id, a2);
        a2.disconnect().unwrap();
        expect(&s2, EventKind::Disconnected);
        quiet(&s1, "client 1");

        // A port nobody behind the relay listens on: REJ "invalid service id" (8).
        let (_id, _qp) = request(&peer, host_ip(), 7003);
        let e = expect(&peer, EventKind::Rejected);
        assert_eq!(e.status, 8, "invalid service id (IBTA 12.6.7)");

        // Client 2 connects to client 1 on the same host: client to client through the relay.
        let (_a3, _b3, qa3, qb3) = connect(&s2, &s1, host_ip(), 7001);
        send_recv(&s2, &qa3, &s1, &qb3);

        // Client 1's listener ends: client 2 may take its port at once.
        l1.destroy();
        let _l = listen(&s2, 7001).unwrap();
        let (_a4, _b4, _, _) = connect(&peer, &s2, host_ip(), 7001);

        let stats = h.relay().stats();
        assert!(
            stats.cm_routed.load(Ordering::Relaxed) >= 12,
            "{}",
            stats.summary()
        );
        assert_eq!(
            stats.cm_unlistened.load(Ordering::Relaxed),
            1,
            "{}",
            stats.summary()
        );
        assert_eq!(
            stats.dropped_gsi.load(Ordering::Relaxed),
            0,
            "{}",
            stats.summary()
        );
        assert_eq!(
            stats.dropped_no_client.load(Ordering::Relaxed),
            0,
            "{}",
            stats.summary()
        );
    }

    #[test]
    fn malformed_mads_to_qp1_are_counted_and_dropped() {
        let h = host("badmad");
        let c1 = h.client();
        let s1 = cm_side(&c1);
        let _l1 = listen(&s1, 7001).unwrap();
        // The remote sends raw MADs from its QP1.
        let gsi = h.peer.open_gsi().unwrap();
        let gid = c1.query_gid(c1.ipv4_gid_index().unwrap()).unwrap();
        let mut to = MadAddress::gsi(gid, h.peer.ipv4_gid_index().unwrap() as u8);
        to.mac = Some(MacAddr(HOST));
        let mut sa = [0u8; 256];
        sa[..4].copy_from_slice(&[1, 0x03, 2, 0x01]); // a subnet administration Get
        gsi.send(&to, &sa).unwrap();
        let mut cpi = [0u8; 256];
        cpi[..4].copy_from_slice(&[1, 0x07, 2, 0x01]); // CM ClassPortInfo Get
        cpi[16..18].copy_from_slice(&0x0001u16.to_be_bytes());
        gsi.send(&to, &cpi).unwrap();
        let mut rtu = [0u8; 256]; // an RTU naming no comm id
        rtu[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        rtu[16..18].copy_from_slice(&0x0014u16.to_be_bytes());
        gsi.send(&to, &rtu).unwrap();
        let stats = h.relay().stats();
        let end = Instant::now() + WAIT;
        while stats.dropped_gsi.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < end, "{}", stats.summary());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stats.cm_routed.load(Ordering::Relaxed), 0);
        // The client's CM saw none of it, and still works.
        assert_eq!(s1.cm.stats()[0].1.received, 0);
        drop(gsi);
        let peer = cm_side(&h.peer);
        connect(&peer, &s1, host_ip(), 7001);
    }
}
