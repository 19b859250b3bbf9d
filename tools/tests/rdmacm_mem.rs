//! The rdma_cm layer (`xroce::rdmacm`) between two devices joined in memory: the whole
//! librdmacm sequence both sides (resolve, route, connect, accept, data, disconnect), REJ with
//! private data, no listener, an unanswered REQ, SIDR for UD, MAD loss, many connections,
//! destroy of a connected id, and the channel's fd.
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use xroce::engine::QpState;
use xroce::rdmacm::*;
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(10);
const SERVER_IP: &str = "198.18.0.2";

fn pair(loss: f64) -> (Device, Device, MemLink) {
    Device::mem_pair(&mem_link_config(1500, loss, 7), DeviceConfig::default()).unwrap()
}

fn quick() -> CmConfigRdma {
    CmConfigRdma::with_short_timers()
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

struct Side {
    cm: Cm,
    ch: EventChannel,
    pd: Pd,
    cq: Cq,
}

fn side(device: &Device, config: CmConfigRdma) -> Side {
    Side {
        cm: Cm::with_config(std::slice::from_ref(device), config, None).unwrap(),
        ch: EventChannel::new().unwrap(),
        pd: device.alloc_pd().unwrap(),
        cq: device.create_cq(64, None).unwrap(),
    }
}

fn listen(s: &Side, ps: PortSpace, port: u16) -> CmId {
    let id = s.cm.create_id(&s.ch, ps).unwrap();
    id.bind_addr(addr("0.0.0.0", port)).unwrap();
    id.listen(8).unwrap();
    id
}

/// The active side up to RouteResolved.
fn resolved(s: &Side, ps: PortSpace, port: u16) -> CmId {
    let id = s.cm.create_id(&s.ch, ps).unwrap();
    id.resolve_addr(None, addr(SERVER_IP, port), WAIT).unwrap();
    let e = s.ch.expect(EventKind::AddrResolved, WAIT).unwrap();
    assert_eq!(e.id, id);
    assert_eq!(e.status, 0);
    id.resolve_route(WAIT).unwrap();
    s.ch.expect(EventKind::RouteResolved, WAIT).unwrap();
    id
}

fn conn_param(event: &RdmaCmEvent) -> &ConnParam {
    match &event.param {
        EventParam::Conn(p) => p,
        other => panic!(
            "{:?}: expected connection parameters, got {other:?}",
            event.kind
        ),
    }
}

fn rc_qp(s: &Side, id: &CmId) -> Qp {
    id.create_qp(&s.pd, &QpInitAttr::rc(&s.cq, &s.cq)).unwrap()
}

/// Client and server connected over RC, with the events' contents checked.
fn connect_rc(client: &Side, server: &Side, port: u16) -> (CmId, CmId, Qp, Qp, CmId) {
    let listener = listen(server, PortSpace::Tcp, port);
    let id = resolved(client, PortSpace::Tcp, port);
    let path = id.path().unwrap();
    assert_eq!(path.remote, addr(SERVER_IP, port));
    assert_eq!(path.local.ip().to_string(), "198.18.0.1");
    assert_eq!(path.next_hop_mac, MacAddr([2, 0, 0, 0, 0, 2]));
    let cqp = rc_qp(client, &id);
    assert_eq!(cqp.state().unwrap(), QpState::Init);
    id.connect(&ConnParam {
        private_data: b"hello".to_vec(),
        responder_resources: 4,
        initiator_depth: 2,
        ..ConnParam::default()
    })
    .unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    assert_eq!(req.listen_id.as_ref(), Some(&listener));
    let p = conn_param(&req);
    // The kernel's rule: the whole field after the 36-byte header, zero padded.
    assert_eq!(p.private_data.len(), 56);
    assert_eq!(&p.private_data[..5], b"hello");
    assert!(p.private_data[5..].iter().all(|&b| b == 0));
    // Seen from the server: the client issues 2 at once and takes 4.
    assert_eq!((p.responder_resources, p.initiator_depth), (2, 4));
    assert_eq!(p.qp_num, cqp.qp_num());
    let child = req.id.clone();
    assert_eq!(child.remote_addr(), id.local_addr());
    assert_eq!(child.local_addr(), Some(addr(SERVER_IP, port)));
    let sqp = rc_qp(server, &child);
    child
        .accept(&ConnParam {
            private_data: b"world".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
    assert_eq!(sqp.state().unwrap(), QpState::Rts);
    let est = client.ch.expect(EventKind::Established, WAIT).unwrap();
    let p = conn_param(&est);
    assert_eq!(p.private_data.len(), 196);
    assert_eq!(&p.private_data[..5], b"world");
    assert_eq!(p.qp_num, sqp.qp_num());
    assert_eq!(cqp.state().unwrap(), QpState::Rts);
    let est = server.ch.expect(EventKind::Established, WAIT).unwrap();
    assert_eq!(est.id, child);
    assert_eq!(child.state(), IdState::Established);
    (id, child, cqp, sqp, listener)
}

fn send_one(from: &Side, qp: &Qp, to: &Side, to_qp: &Qp, text: &[u8]) {
    let rmr = to.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    to_qp
        .post_recv(&RecvWr {
            wr_id: 9,
            sg_list: vec![rmr.sge(0, 4096).unwrap()],
        })
        .unwrap();
    let smr = from.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    smr.write(0, text).unwrap();
    qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: vec![smr.sge(0, text.len() as u32).unwrap()],
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let wc = from.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    let wc = to.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len as usize, text.len());
    assert_eq!(rmr.to_vec(0, text.len()).unwrap(), text);
}

#[test]
fn rc_connect_exchange_and_disconnect() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let (id, child, cqp, sqp, _listener) = connect_rc(&client, &server, 7174);
    send_one(&client, &cqp, &server, &sqp, b"ping");
    send_one(&server, &sqp, &client, &cqp, b"pong");
    // The client ends it: its QP errs at once, DREQ, the server is told, DREP.
    id.disconnect().unwrap();
    assert_eq!(cqp.state().unwrap(), QpState::Err);
    let e = server.ch.expect(EventKind::Disconnected, WAIT).unwrap();
    assert_eq!(e.id, child);
    child.disconnect().unwrap();
    assert_eq!(sqp.state().unwrap(), QpState::Err);
    let e = client.ch.expect(EventKind::Disconnected, WAIT).unwrap();
    assert_eq!(e.id, id);
    // A second disconnect succeeds and sends nothing (the kernel's rdma_disconnect
    // returns 0 on a connection that is over; ucmatose and rping call it then).
    let sent = client.cm.stats()[0].1.sent;
    id.disconnect().unwrap();
    assert_eq!(client.cm.stats()[0].1.sent, sent);
    // Time wait ends on both sides (2 × packet lifetime + ACK delay: well under WAIT).
    client.ch.expect(EventKind::TimewaitExit, WAIT).unwrap();
    server.ch.expect(EventKind::TimewaitExit, WAIT).unwrap();
}

#[test]
fn reject_carries_reason_and_private_data() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let _listener = listen(&server, PortSpace::Tcp, 5000);
    let id = resolved(&client, PortSpace::Tcp, 5000);
    let qp = rc_qp(&client, &id);
    id.connect(&ConnParam::default()).unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    req.id.reject(b"go away").unwrap();
    assert_eq!(req.id.state(), IdState::Closed);
    let e = client.ch.expect(EventKind::Rejected, WAIT).unwrap();
    assert_eq!(e.status, 28, "consumer defined (IBTA 12.6.7)");
    assert_eq!(&conn_param(&e).private_data[..7], b"go away");
    assert_eq!(qp.state().unwrap(), QpState::Err);
    assert!(matches!(
        req.id.accept(&ConnParam::default()),
        Err(RdmaCmError::WrongState { .. })
    ));
}

#[test]
fn no_listener_is_rejected_invalid_service_id() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let _other = listen(&server, PortSpace::Tcp, 5001);
    let id = resolved(&client, PortSpace::Tcp, 5002);
    rc_qp(&client, &id);
    id.connect(&ConnParam::default()).unwrap();
    let e = client.ch.expect(EventKind::Rejected, WAIT).unwrap();
    assert_eq!(e.status, 8, "invalid service id (IBTA 12.6.7)");
    assert!(server.ch.try_get_event().is_none());
}

#[test]
fn unanswered_req_is_unreachable() {
    let (a, _b, link) = pair(0.0);
    let config = CmConfigRdma {
        max_cm_retries: 2,
        ..quick()
    };
    let client = side(&a, config);
    let id = resolved(&client, PortSpace::Tcp, 6000);
    rc_qp(&client, &id);
    link.set_cut(true);
    let started = Instant::now();
    id.connect(&ConnParam::default()).unwrap();
    let e = client.ch.expect(EventKind::Unreachable, WAIT).unwrap();
    assert_eq!(e.status, -libc::ETIMEDOUT);
    // Three sends, each waiting 2 × 2^8 + 2^12 × 4.096 µs ≈ 19 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
    let stats = &client.cm.stats()[0].1;
    assert_eq!(stats.retransmits, 2);
}

#[test]
fn connections_survive_mad_loss() {
    // 25% of frames lost each way: over ten connections some REQ, REP, RTU, DREQ or DREP
    // is lost and resent (seeded: the same frames each run).
    let (a, b, link) =
        Device::mem_pair(&mem_link_config(1500, 0.25, 11), DeviceConfig::default()).unwrap();
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    for round in 0..10u16 {
        let (id, child, _cqp, _sqp, listener) = connect_rc(&client, &server, 7000 + round);
        id.disconnect().unwrap();
        server.ch.expect(EventKind::Disconnected, WAIT).unwrap();
        child.disconnect().unwrap();
        // The DREP may be lost: the client's DREQ is resent and answered again.
        let e = client.ch.expect(EventKind::Disconnected, WAIT).unwrap();
        assert_eq!(e.id, id);
        listener.destroy();
    }
    let resent = client.cm.stats()[0].1.retransmits + server.cm.stats()[0].1.retransmits;
    assert!(
        resent > 0,
        "no MAD was resent: the loss did not hit the handshake"
    );
    assert!(link.stats().lost.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn ud_ids_resolve_the_peer_qp_with_sidr() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let listener = listen(&server, PortSpace::Udp, 7171);
    let id = resolved(&client, PortSpace::Udp, 7171);
    let cqp = id
        .create_qp(&client.pd, &QpInitAttr::ud(&client.cq, &client.cq))
        .unwrap();
    assert_eq!(cqp.state().unwrap(), QpState::Rts);
    id.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    assert_eq!(req.listen_id.as_ref(), Some(&listener));
    let EventParam::Ud(ud) = &req.param else {
        panic!("{:?}", req.param)
    };
    assert_eq!(&ud.private_data[..3], b"ud?");
    let sqp = req
        .id
        .create_qp(&server.pd, &QpInitAttr::ud(&server.cq, &server.cq))
        .unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    let est = client.ch.expect(EventKind::Established, WAIT).unwrap();
    let EventParam::Ud(ud) = &est.param else {
        panic!("{:?}", est.param)
    };
    assert_eq!(ud.qp_num, sqp.qp_num());
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    // A datagram to what SIDR found.
    let rmr = server.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    sqp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: vec![rmr.sge(0, 4096).unwrap()],
    })
    .unwrap();
    let ah = client.pd.create_ah(&ud.ah_attr).unwrap();
    let smr = client.pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    smr.write(0, b"datagram").unwrap();
    cqp.post_send(&SendWr {
        wr_id: 4,
        op: WrOp::Send,
        sg_list: vec![smr.sge(0, 8).unwrap()],
        flags: SendFlags::SIGNALED,
        ud: Some(xroce::engine::UdDest {
            av: ah.av(),
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
        }),
    })
    .unwrap();
    let wc = server.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(rmr.to_vec(40, 8).unwrap(), b"datagram");
}

#[test]
fn many_connections_at_once() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let _listener = listen(&server, PortSpace::Tcp, 9000);
    const N: usize = 40;
    let mut ids = Vec::new();
    for _ in 0..N {
        let id = resolved(&client, PortSpace::Tcp, 9000);
        let cq = a.create_cq(4, None).unwrap();
        id.create_qp(&client.pd, &QpInitAttr::rc(&cq, &cq)).unwrap();
        id.connect(&ConnParam::default()).unwrap();
        ids.push((id, cq));
    }
    let mut children = Vec::new();
    let mut server_cqs = Vec::new();
    while children.len() < N {
        let e = server.ch.get_event(Some(WAIT)).unwrap();
        if e.kind == EventKind::ConnectRequest {
            let cq = b.create_cq(4, None).unwrap();
            e.id.create_qp(&server.pd, &QpInitAttr::rc(&cq, &cq))
                .unwrap();
            e.id.accept(&ConnParam::default()).unwrap();
            children.push(e.id);
            server_cqs.push(cq);
        }
    }
    let mut established = 0;
    while established < N {
        let e = client.ch.get_event(Some(WAIT)).unwrap();
        assert_eq!(e.kind, EventKind::Established, "status {}", e.status);
        established += 1;
    }
    let ports: std::collections::HashSet<_> = ids
        .iter()
        .map(|(id, _)| id.local_addr().unwrap().port())
        .collect();
    assert_eq!(ports.len(), N, "each active id has its own source port");
}

#[test]
fn destroying_a_connected_id_disconnects_the_peer() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let (id, child, _cqp, _sqp, _l) = connect_rc(&client, &server, 7200);
    id.destroy();
    assert_eq!(id.state(), IdState::Destroyed);
    let e = server.ch.expect(EventKind::Disconnected, WAIT).unwrap();
    assert_eq!(e.id, child);
}

#[test]
fn wrong_order_and_bad_values_are_typed_errors() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let id = client.cm.create_id(&client.ch, PortSpace::Tcp).unwrap();
    assert!(matches!(
        id.connect(&ConnParam::default()),
        Err(RdmaCmError::WrongState { .. })
    ));
    assert!(matches!(id.listen(1), Err(RdmaCmError::WrongState { .. })));
    assert!(matches!(
        client.cm.create_id(&client.ch, PortSpace::Ib),
        Err(RdmaCmError::Unsupported(_))
    ));
    // An address no device has.
    let e = id.bind_addr(addr("198.18.9.9", 1)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL);
    // The same port twice.
    let _l = listen(&server, PortSpace::Tcp, 4000);
    let again = server.cm.create_id(&server.ch, PortSpace::Tcp).unwrap();
    let e = again.bind_addr(addr(SERVER_IP, 4000)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE);
    // Private data longer than a REQ holds after the header (56).
    let id = resolved(&client, PortSpace::Tcp, 4000);
    rc_qp(&client, &id);
    let e = id
        .connect(&ConnParam {
            private_data: vec![1; 57],
            ..ConnParam::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(id.state(), IdState::RouteResolved);
    // A second QP on the id.
    assert!(matches!(
        id.create_qp(&client.pd, &QpInitAttr::rc(&client.cq, &client.cq)),
        Err(RdmaCmError::QpExists)
    ));
    // QP1 of a device is taken by the first Cm.
    assert!(Cm::new(std::slice::from_ref(&a)).is_err());
}

#[test]
fn channel_fd_is_readable_exactly_while_events_wait() {
    let (a, _b, _link) = pair(0.0);
    let client = side(&a, quick());
    let readable = |ch: &EventChannel| {
        let mut fds = [rustix::event::PollFd::from_borrowed_fd(
            ch.as_fd(),
            rustix::event::PollFlags::IN,
        )];
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())).unwrap() == 1
    };
    assert!(!readable(&client.ch));
    let id = client.cm.create_id(&client.ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr(SERVER_IP, 1), WAIT).unwrap();
    let deadline = Instant::now() + WAIT;
    while !readable(&client.ch) {
        assert!(Instant::now() < deadline, "no event");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(client.ch.queued(), 1);
    let e = client.ch.try_get_event().unwrap();
    assert_eq!(e.kind, EventKind::AddrResolved);
    assert!(!readable(&client.ch));
    assert!(matches!(
        client.ch.get_event(Some(Duration::from_millis(20))),
        Err(RdmaCmError::Timeout(_))
    ));
}

#[test]
fn event_names_are_librdmacm_s() {
    assert_eq!(EventKind::ConnectRequest.code(), 4);
    assert_eq!(EventKind::TimewaitExit.code(), 15);
    assert_eq!(EventKind::Established.name(), "RDMA_CM_EVENT_ESTABLISHED");
}

/// An id without a QP: ConnectResponse, the application moves its QP with init_qp_attr. Its
/// data reaches the passive side before any RTU, which is then established all the same
/// (IBTA 12.9.6); the RTU sent later by `establish` does not report it twice.
#[test]
fn data_before_the_rtu_establishes_the_passive_side() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let _listener = listen(&server, PortSpace::Tcp, 7300);
    let id = resolved(&client, PortSpace::Tcp, 7300);
    let cqp = client
        .pd
        .create_qp(&QpInitAttr::rc(&client.cq, &client.cq))
        .unwrap();
    id.connect(&ConnParam {
        qp_num: cqp.qp_num(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    let sqp = rc_qp(&server, &req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    let resp = client.ch.expect(EventKind::ConnectResponse, WAIT).unwrap();
    assert_eq!(conn_param(&resp).qp_num, sqp.qp_num());
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attr, mask) = id.init_qp_attr(state).unwrap();
        cqp.modify(&attr, mask).unwrap();
    }
    assert!(
        server.ch.try_get_event().is_none(),
        "established without RTU or data"
    );
    send_one(&client, &cqp, &server, &sqp, b"early");
    let est = server.ch.expect(EventKind::Established, WAIT).unwrap();
    assert_eq!(est.id, req.id);
    // librdmacm reports nothing after rdma_establish: the caller knows.
    id.establish().unwrap();
    assert_eq!(id.state(), IdState::Established);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        client.ch.try_get_event().is_none(),
        "an event after establish"
    );
    assert!(
        server.ch.try_get_event().is_none(),
        "established reported twice"
    );
    assert!(matches!(
        id.establish(),
        Err(RdmaCmError::WrongState { .. })
    ));
}

/// A dropped Cm closes QP1 before the drop returns: another Cm opens it at once.
#[test]
fn dropping_the_cm_frees_qp1() {
    let (a, _b, _link) = pair(0.0);
    for _ in 0..20 {
        let cm = Cm::new(std::slice::from_ref(&a)).unwrap();
        let ch = EventChannel::new().unwrap();
        let id = cm.create_id(&ch, PortSpace::Tcp).unwrap();
        id.bind_addr(addr("198.18.0.1", 0)).unwrap();
        drop(id);
        drop(cm);
    }
}

/// Both ends on one device (a client and a server in one process): the CM's MADs and the
/// data loop back inside the device.
#[test]
fn both_ends_on_one_device() {
    let (a, _b, _link) = pair(0.0);
    let server = side(&a, quick());
    let client = Side {
        cm: server.cm.clone(),
        ch: EventChannel::new().unwrap(),
        pd: a.alloc_pd().unwrap(),
        cq: a.create_cq(64, None).unwrap(),
    };
    let _listener = listen(&server, PortSpace::Tcp, 7400);
    let id = client.cm.create_id(&client.ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr("198.18.0.1", 7400), WAIT)
        .unwrap();
    client.ch.expect(EventKind::AddrResolved, WAIT).unwrap();
    id.resolve_route(WAIT).unwrap();
    client.ch.expect(EventKind::RouteResolved, WAIT).unwrap();
    let qp = rc_qp(&client, &id);
    id.connect(&ConnParam::default()).unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    let peer_qp = rc_qp(&server, &req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    client.ch.expect(EventKind::Established, WAIT).unwrap();
    server.ch.expect(EventKind::Established, WAIT).unwrap();
    send_one(&client, &qp, &server, &peer_qp, b"to myself");
}

/// A loopback bind takes the first device, as Linux's rdma_cm does (cma_bind_loopback; the
/// libfabric verbs provider binds 127.0.0.1 to find a device), and keeps the loopback
/// address, which listens like the wildcard (Linux's cma_any_addr counts loopback as "any"):
/// a REQ from the network for the port, to the device's real address, is heard, and the
/// connection's id has that real address (libfabric's `fi_pingpong -e msg` server listens on
/// 127.0.0.1; its client is given the server's address). The port is taken on every
/// address. Without a device the bind is refused.
#[test]
fn a_loopback_listener_hears_reqs_for_any_local_address() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let lo = server.cm.create_id(&server.ch, PortSpace::Tcp).unwrap();
    lo.bind_addr(addr("127.0.0.1", 5003)).unwrap();
    // Like the wildcard, no device (Linux acquires one only when !cma_any_addr): libfabric's
    // verbs provider then publishes the devices' addresses, not 127.0.0.1.
    assert!(lo.device().is_none());
    lo.listen(1).unwrap();
    assert_eq!(lo.local_addr(), Some(addr("127.0.0.1", 5003)));
    let same_port = server.cm.create_id(&server.ch, PortSpace::Tcp).unwrap();
    assert!(
        same_port.bind_addr(addr(SERVER_IP, 5003)).is_err(),
        "the loopback listener's port is taken on the device's address too"
    );

    let id = resolved(&client, PortSpace::Tcp, 5003);
    let cqp = rc_qp(&client, &id);
    id.connect(&ConnParam::default()).unwrap();
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    assert_eq!(req.listen_id.as_ref(), Some(&lo));
    let child = req.id.clone();
    assert_eq!(child.local_addr(), Some(addr(SERVER_IP, 5003)));
    assert_eq!(child.remote_addr(), id.local_addr());
    let sqp = rc_qp(&server, &child);
    child.accept(&ConnParam::default()).unwrap();
    client.ch.expect(EventKind::Established, WAIT).unwrap();
    server.ch.expect(EventKind::Established, WAIT).unwrap();
    send_one(&client, &cqp, &server, &sqp, b"over loopback's listener");

    let no_device = Cm::with_config(&[], quick(), None).unwrap();
    let ch = EventChannel::new().unwrap();
    let id = no_device.create_id(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(addr("127.0.0.1", 5004)).unwrap();
    assert!(id.device().is_none());
    let id = no_device.create_id(&ch, PortSpace::Tcp).unwrap();
    let err = id.bind_addr(addr(SERVER_IP, 5004)).unwrap_err();
    assert_eq!(err.errno(), libc::EADDRNOTAVAIL, "{err}");
}

/// perftest -R's client sends the test QPs' REQs the moment the last sync message arrives,
/// while the server may still be sending it: the server listens from `CmQps::new`, so a REQ
/// that comes long before the server gets to `connect` waits and is accepted (before, it
/// met REJ "invalid service id", and Debian's ib_write_bw crashed on that REJECTED).
#[test]
fn perftest_server_takes_test_qp_reqs_sent_before_it_accepts() {
    use xroce_tools::perftest::cm::CmQps;
    use xroce_tools::perftest::oob::Role;
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let mut server_qps = CmQps::new(&server.cm, Role::Server, None, 18515, None).unwrap();
    let mut client_qps =
        CmQps::new(&client.cm, Role::Client, Some(SERVER_IP), 18515, None).unwrap();
    let client_qp = client
        .pd
        .create_qp(&QpInitAttr::rc(&client.cq, &client.cq))
        .unwrap();
    let started = Instant::now();
    let connecting = std::thread::spawn(move || {
        client_qps
            .connect(std::slice::from_ref(&client_qp))
            .map(|()| (client_qps, client_qp))
    });
    // Longer than the client's ten 100 ms retries after a REJECTED.
    std::thread::sleep(Duration::from_millis(1500));
    let server_qp = server
        .pd
        .create_qp(&QpInitAttr::rc(&server.cq, &server.cq))
        .unwrap();
    server_qps
        .connect(std::slice::from_ref(&server_qp))
        .unwrap();
    let (_client_qps, client_qp) = connecting.join().unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let deadline = Instant::now() + WAIT;
    while client_qp.state().unwrap() != QpState::Rts || server_qp.state().unwrap() != QpState::Rts {
        assert!(Instant::now() < deadline, "QPs not connected");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// perf's `-R` client connecting `count` fresh RC QPs of `client` to the server at `port`,
/// in a thread of its own; joined, it gives back the client's ids and its QPs.
fn perftest_client_connecting(
    client: &Side,
    port: u16,
    count: usize,
) -> std::thread::JoinHandle<anyhow::Result<(xroce_tools::perftest::cm::CmQps, Vec<Qp>)>> {
    use xroce_tools::perftest::cm::CmQps;
    use xroce_tools::perftest::oob::Role;
    let mut client_qps = CmQps::new(&client.cm, Role::Client, Some(SERVER_IP), port, None).unwrap();
    let qps: Vec<Qp> = (0..count)
        .map(|_| {
            client
                .pd
                .create_qp(&QpInitAttr::rc(&client.cq, &client.cq))
                .unwrap()
        })
        .collect();
    std::thread::spawn(move || client_qps.connect(&qps).map(|()| (client_qps, qps)))
}

/// perftest -R against Debian's server: that server listens for the test QPs only once its
/// last sync message is acknowledged, so the client's first REQ can come early and meet REJ;
/// it then accepts every request that comes, one QP per request, and fails past its `-q`.
/// With two REQs in flight the first was rejected and the second accepted, and the retry of
/// both asked for a third connection. The client now connects its ids one at a time: the
/// server below (rejecting the first request, as the early one is) sees three requests and
/// accepts exactly two.
#[test]
fn perftest_client_retrying_an_early_req_asks_no_more_connections_than_qps() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let listener = listen(&server, PortSpace::Tcp, 18515);
    let connecting = perftest_client_connecting(&client, 18515, 2);
    let (mut requests, mut accepted, mut established) = (0, Vec::new(), 0);
    // Until both connections are up, then a while longer: a third request must not come.
    let mut quiet_until = None;
    loop {
        let wait = match quiet_until {
            Some(t) if Instant::now() >= t => break,
            Some(t) => t - Instant::now(),
            None => WAIT,
        };
        let e = match server.ch.get_event(Some(wait)) {
            Ok(e) => e,
            Err(_) if quiet_until.is_some() => break,
            Err(e) => panic!("no connection request or RTU in time: {e}"),
        };
        match e.kind {
            EventKind::ConnectRequest => {
                requests += 1;
                if requests == 1 {
                    e.id.reject(&[]).unwrap();
                } else {
                    let qp = rc_qp(&server, &e.id);
                    e.id.accept(&ConnParam::default()).unwrap();
                    accepted.push((e.id, qp));
                }
            }
            EventKind::Established => {
                established += 1;
                if established == 2 {
                    quiet_until = Some(Instant::now() + Duration::from_millis(500));
                }
            }
            other => panic!("server event {other:?}: a connection the client gave up?"),
        }
    }
    let (_client_qps, qps) = connecting.join().unwrap().unwrap();
    assert_eq!(
        (requests, accepted.len()),
        (3, 2),
        "the server saw {requests} requests and accepted {}",
        accepted.len()
    );
    assert!(qps.iter().all(|qp| qp.state().unwrap() == QpState::Rts));
    drop(listener);
}

/// perftest's server listens for the test QPs only once its last sync message is
/// acknowledged; when that ACK is lost, the message comes again one ACK timeout later (2.1 s
/// at the Cm's default) and the server rejects the client's requests until then. The client
/// keeps asking past perftest's ten tries in a second: here the server rejects every request
/// for 2.5 s, then accepts.
#[test]
fn perftest_client_outlasts_a_server_that_listens_late() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let listener = listen(&server, PortSpace::Tcp, 18516);
    let connecting = perftest_client_connecting(&client, 18516, 1);
    let listening_at = Instant::now() + Duration::from_millis(2500);
    let (mut rejected, mut accepted) = (0, None);
    while accepted.is_none() {
        let e = server
            .ch
            .get_event(Some(WAIT))
            .unwrap_or_else(|e| panic!("no request after {rejected} rejected: {e}"));
        match e.kind {
            EventKind::ConnectRequest if Instant::now() < listening_at => {
                e.id.reject(&[]).unwrap();
                rejected += 1;
            }
            EventKind::ConnectRequest => {
                let sqp = rc_qp(&server, &e.id);
                e.id.accept(&ConnParam::default()).unwrap();
                accepted = Some((e.id, sqp));
            }
            other => panic!("server event {other:?}"),
        }
    }
    server.ch.expect(EventKind::Established, WAIT).unwrap();
    let (_client_qps, qps) = connecting.join().unwrap().unwrap();
    assert!(
        rejected > 10,
        "only {rejected} requests before the server listened"
    );
    assert_eq!(qps[0].state().unwrap(), QpState::Rts);
    drop(listener);
}

/// A REQ that comes a moment before its listener (perftest 4.5's `-R` server listens for its
/// test QPs only after the exchange, while its client connects at once) waits for it
/// (`LISTEN_GRACE`) instead of meeting REJ: Debian's perftest client cannot retry one.
#[test]
fn a_connect_before_the_listen_is_taken_by_the_listener() {
    let (a, b, _link) = pair(0.0);
    let (client, server) = (side(&a, quick()), side(&b, quick()));
    let id = resolved(&client, PortSpace::Tcp, 5010);
    let _qp = rc_qp(&client, &id);
    id.connect(&ConnParam::default()).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let _listener = listen(&server, PortSpace::Tcp, 5010);
    let req = server.ch.expect(EventKind::ConnectRequest, WAIT).unwrap();
    let sqp = rc_qp(&server, &req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    client.ch.expect(EventKind::Established, WAIT).unwrap();
    assert_eq!(sqp.state().unwrap(), QpState::Rts);
}
