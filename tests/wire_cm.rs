//! CM MADs in real rxe captures (tests/fixtures/rxe_cm_*.pcap, two rxe guests of the lab,
//! kernel 6.1): they parse, carry the values the exchange must have, and re-emit byte for
//! byte. Then property tests: parse(emit(x)) == x for generated messages, and no input
//! panics.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use proptest::prelude::*;
use xroce::capture::read_capture;
use xroce::wire::cm::*;
use xroce::wire::cma::{service_id, split_service_id, CmaHeader, PortSpace};
use xroce::wire::mad::{MadError, MadHeader, GSI_QKEY, GSI_QPN, MAD_DATA_LEN, MAD_LEN};
use xroce::wire::{parse_frame, IpRepr, Opcode, Transport};

/// One RoCE frame of a capture, with the CM MAD it carries if any.
struct Frame {
    time: std::time::Duration,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_src_port: u16,
    opcode: Opcode,
    dest_qp: u32,
    psn: u32,
    qkey: Option<u32>,
    src_qp: Option<u32>,
    mad: Option<(CmMad, Vec<u8>)>,
}

fn frames(name: &str) -> Vec<Frame> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let mut out = vec![];
    for f in read_capture(path).unwrap() {
        let p = parse_frame(&f.data).unwrap();
        assert!(p.icrc_ok(), "{name} frame {}", f.number);
        let IpRepr::V4 { src, dst, .. } = p.repr.ip else {
            panic!("IPv6 in {name}")
        };
        let roce = &p.repr.roce;
        let mad = gsi_cm_mad(roce).map(|m| (m.unwrap(), roce.payload.to_vec()));
        out.push(Frame {
            time: f.timestamp,
            src,
            dst,
            udp_src_port: p.repr.udp_src_port,
            opcode: roce.bth.opcode,
            dest_qp: roce.bth.dest_qp,
            psn: roce.bth.psn.value(),
            qkey: roce.deth.map(|d| d.qkey),
            src_qp: roce.deth.map(|d| d.src_qp),
            mad,
        });
    }
    out
}

fn mads(frames: &[Frame]) -> Vec<&Frame> {
    frames.iter().filter(|f| f.mad.is_some()).collect()
}

fn msg(f: &Frame) -> &CmMessage {
    &f.mad.as_ref().unwrap().0.message
}

const G1: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const G2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);

/// Every CM MAD is a GSI datagram (QP1 to QP1, Q_Key 0x80010000), has the CM header, and
/// re-emits to the very bytes captured.
fn check_gsi_and_round_trip(frames: &[Frame]) {
    for f in mads(frames) {
        let (mad, bytes) = f.mad.as_ref().unwrap();
        assert_eq!(f.dest_qp, GSI_QPN);
        assert_eq!(f.src_qp, Some(GSI_QPN));
        assert_eq!(f.qkey, Some(GSI_QKEY));
        assert_eq!(bytes.len(), MAD_LEN);
        mad.header.check_cm().unwrap();
        assert_eq!(mad.header.attribute_id, mad.message.attribute_id());
        assert_eq!(
            &mad.to_bytes().unwrap()[..],
            &bytes[..],
            "{}",
            mad.message.name()
        );
    }
}

#[test]
fn rping_connects_and_disconnects_with_req_rep_rtu_dreq_drep() {
    let all = frames("rxe_cm_rping.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    let names: Vec<_> = cm.iter().map(|f| msg(f).name()).collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    let (CmMessage::Req(req), CmMessage::Rep(rep), CmMessage::Rtu(rtu)) =
        (msg(cm[0]), msg(cm[1]), msg(cm[2]))
    else {
        panic!("not REQ, REP, RTU")
    };
    // g2 (the client) sends the REQ to g1 (the server).
    assert_eq!((cm[0].src, cm[0].dst), (G2, G1));
    assert_eq!((cm[1].src, cm[1].dst), (G1, G2));
    // rping's default port 7174 in the TCP port space.
    assert_eq!(req.service_id, service_id(PortSpace::Tcp, 7174));
    assert_eq!(req.service_id, 0x0106_1C06);
    assert_eq!(
        split_service_id(req.service_id),
        Some((PortSpace::Tcp, 7174))
    );
    assert_eq!(req.transport_type, TransportType::Rc);
    assert_eq!(req.path_mtu, PathMtu::Mtu1024);
    assert_eq!(req.partition_key, 0xFFFF);
    // The RoCE path: permissive LIDs, IPv4-mapped GIDs of the two guests.
    assert_eq!(req.primary_path.local_lid, 0xFFFF);
    assert_eq!(req.primary_path.local_gid, G2.to_ipv6_mapped().octets());
    assert_eq!(req.primary_path.remote_gid, G1.to_ipv6_mapped().octets());
    assert_eq!(req.primary_path.hop_limit, 64);
    assert!(req.alternate_path.is_empty());
    // The kernel's CM timeouts and retries.
    assert_eq!(req.remote_cm_response_timeout, 20);
    assert_eq!(req.local_cm_response_timeout, 20);
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    // The comm ids pair up.
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (req.local_comm_id, rep.local_comm_id)
    );
    // One transaction id for the whole exchange: the active side's, since it also sent the
    // DREQ (REP, RTU and DREP reuse the id of what they answer).
    for f in &cm {
        assert_eq!(
            f.mad.as_ref().unwrap().0.header.transaction_id,
            cm[0].mad.as_ref().unwrap().0.header.transaction_id
        );
    }
    // rdma_cm's header: IPv4, the client's port, the two addresses.
    let hdr = CmaHeader::parse(req.private_data.as_bytes()).unwrap();
    assert_eq!(hdr.src_addr, IpAddr::V4(G2));
    assert_eq!(hdr.dst_addr, IpAddr::V4(G1));
    assert_ne!(hdr.src_port, 0);
    assert!(rep.private_data.is_zero());

    // The RC data packets use the QPNs and PSNs the REQ and REP announced.
    let data: Vec<_> = all
        .iter()
        .filter(|f| f.mad.is_none() && f.dest_qp != GSI_QPN)
        .collect();
    assert!(data.len() > 10);
    // The first request (not an ACK, which carries the PSN it acknowledges) each way.
    let first_request = |from| {
        data.iter()
            .find(|f| f.src == from && f.opcode != Opcode::RC_ACKNOWLEDGE)
            .unwrap()
    };
    let (first_c2s, first_s2c) = (first_request(G2), first_request(G1));
    assert_eq!(first_c2s.dest_qp, rep.local_qpn);
    assert_eq!(first_s2c.dest_qp, req.local_qpn);
    // Each side's starting PSN is where its peer starts sending (the PSN it will receive):
    // the client's first packet has the REP's PSN, the server's the REQ's.
    assert_eq!(first_c2s.psn, rep.starting_psn);
    assert_eq!(first_s2c.psn, req.starting_psn);
    assert_ne!(rep.starting_psn, req.starting_psn);
    for f in &data {
        let expected = if f.src == G2 {
            rep.local_qpn
        } else {
            req.local_qpn
        };
        assert_eq!(f.dest_qp, expected, "{:?}", f.opcode);
    }
    // The flow label the REQ carries is where the data's UDP source port comes from
    // (rdma_flow_label_to_udp_sport: low 14 bits ^ high 6 bits, | 0xC000).
    let fl = req.primary_path.flow_label;
    let sport = (((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000) as u16;
    assert!(data.iter().all(|f| f.udp_src_port == sport));

    // The client disconnects: DREQ names the server's QP, DREP answers with the ids swapped.
    let (CmMessage::Dreq(dreq), CmMessage::Drep(drep)) = (msg(cm[3]), msg(cm[4])) else {
        panic!()
    };
    assert_eq!(
        (dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn),
        (req.local_comm_id, rep.local_comm_id, rep.local_qpn)
    );
    assert_eq!(
        (drep.local_comm_id, drep.remote_comm_id),
        (rep.local_comm_id, req.local_comm_id)
    );
}

#[test]
fn udaddy_resolves_its_service_with_sidr() {
    let all = frames("rxe_cm_udaddy.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    let (CmMessage::SidrReq(req), CmMessage::SidrRep(rep)) = (msg(cm[0]), msg(cm[1])) else {
        panic!("not SIDR_REQ, SIDR_REP")
    };
    assert_eq!(cm.len(), 2);
    assert_eq!(req.service_id, service_id(PortSpace::Udp, 7174));
    assert_eq!(rep.service_id, req.service_id);
    assert_eq!(rep.request_id, req.request_id);
    assert_eq!(rep.status, SidrStatus::Success);
    // rdma_cm's UD Q_Key (RDMA_UDP_QKEY).
    assert_eq!(rep.qkey, 0x0123_4567);
    let hdr = CmaHeader::parse(req.private_data.as_bytes()).unwrap();
    assert_eq!(
        (hdr.src_addr, hdr.dst_addr),
        (IpAddr::V4(G2), IpAddr::V4(G1))
    );
    // The client's datagrams go to the QPN and Q_Key the SIDR_REP gave.
    let sends: Vec<_> = all
        .iter()
        .filter(|f| f.mad.is_none() && f.src == G2 && f.opcode.transport() == Some(Transport::Ud))
        .collect();
    assert!(!sends.is_empty());
    for f in sends {
        assert_eq!((f.dest_qp, f.qkey), (rep.qpn, Some(rep.qkey)));
    }
}

#[test]
fn connecting_to_a_port_nobody_listens_on_is_rejected_invalid_service_id() {
    let all = frames("rxe_cm_reject.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    assert_eq!(cm.len(), 2);
    let (CmMessage::Req(req), CmMessage::Rej(rej)) = (msg(cm[0]), msg(cm[1])) else {
        panic!("not REQ, REJ")
    };
    assert_eq!(req.service_id, service_id(PortSpace::Tcp, 9999));
    assert_eq!(rej.reason, RejectReason::InvalidServiceId);
    assert_eq!(rej.reason.code(), 8);
    assert_eq!(rej.message_rejected, RejectedMessage::Req);
    assert_eq!(rej.remote_comm_id, req.local_comm_id);
    // No connection was made on the passive side: it has no comm id to give.
    assert_eq!(rej.local_comm_id, 0);
    assert_eq!(rej.reject_info_length, 0);
}

#[test]
fn a_lost_req_is_resent_unchanged_after_the_response_timeout() {
    // g1 dropped everything for the first seconds (netem loss 100% on its link, captured
    // before the drop): the first REQ never arrived.
    let all = frames("rxe_cm_lost_req.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    let names: Vec<_> = cm.iter().map(|f| msg(f).name()).collect();
    assert_eq!(names, ["REQ", "REQ", "REP", "RTU", "DREQ", "DREP"]);
    // The resend is the same MAD, transaction id included (IBTA 13.4.6.4); only the GSI
    // QP's BTH PSN moved on.
    assert_eq!(cm[0].mad.as_ref().unwrap().1, cm[1].mad.as_ref().unwrap().1);
    assert_eq!(cm[1].psn, cm[0].psn + 1);
    // It waited longer than the remote CM response timeout it announced (4.096 µs × 2^20):
    // Linux adds twice the path's packet lifetime (6.2 s seen).
    let CmMessage::Req(req) = msg(cm[0]) else {
        panic!()
    };
    let waited = cm[1].time - cm[0].time;
    assert!(waited > timeout_duration(req.remote_cm_response_timeout));
    assert!(waited < std::time::Duration::from_secs(8), "{waited:?}");
}

#[test]
fn a_req_resent_to_a_busy_listener_gets_an_mra() {
    // rping -s was stopped (SIGSTOP) when the REQ came and continued 14 s later: the
    // passive CM answered the duplicate REQ with an MRA, then the REP came once rping
    // accepted.
    let all = frames("rxe_cm_slow_accept.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    let names: Vec<_> = cm.iter().map(|f| msg(f).name()).collect();
    assert_eq!(names, ["REQ", "REQ", "MRA", "REP", "RTU", "DREQ", "DREP"]);
    let (CmMessage::Req(req), CmMessage::Mra(mra), CmMessage::Rep(rep)) =
        (msg(cm[0]), msg(cm[2]), msg(cm[3]))
    else {
        panic!()
    };
    assert_eq!(mra.message_mraed, MraedMessage::Req);
    assert_eq!(mra.remote_comm_id, req.local_comm_id);
    assert_eq!(mra.local_comm_id, rep.local_comm_id);
    // rdma_cm's MRA asks for 4.096 µs × 2^24 = 68.7 s more, so the REQ's 15 retries wait.
    assert_eq!(mra.service_timeout, 24);
    assert!(timeout_duration(mra.service_timeout) > std::time::Duration::from_secs(60));
    // Sent right after the duplicate REQ, long before the REP.
    assert!(cm[2].time - cm[1].time < std::time::Duration::from_millis(100));
    assert!(cm[3].time - cm[2].time > std::time::Duration::from_secs(5));
}

#[test]
fn three_ucmatose_connections_interleave_and_the_passive_side_disconnects() {
    let all = frames("rxe_cm_ucmatose.pcap");
    check_gsi_and_round_trip(&all);
    let cm = mads(&all);
    assert_eq!(cm.len(), 15);
    let tid = |f: &Frame| f.mad.as_ref().unwrap().0.header.transaction_id;
    let reqs: Vec<&Frame> = cm
        .iter()
        .copied()
        .filter(|f| matches!(msg(f), CmMessage::Req(_)))
        .collect();
    assert_eq!(reqs.len(), 3);
    for r in reqs {
        let CmMessage::Req(req) = msg(r) else {
            unreachable!()
        };
        // ucmatose's default port.
        assert_eq!(req.service_id, service_id(PortSpace::Tcp, 7471));
        let of_this = |f: &&Frame| {
            let m = msg(f);
            m.local_comm_id() == req.local_comm_id || m.remote_comm_id() == Some(req.local_comm_id)
        };
        let conn: Vec<&Frame> = cm.iter().copied().filter(of_this).collect();
        let names: Vec<_> = conn.iter().map(|f| msg(f).name()).collect();
        assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
        let (CmMessage::Rep(rep), CmMessage::Dreq(dreq)) = (msg(conn[1]), msg(conn[3])) else {
            panic!()
        };
        // The server (g1) disconnects: its DREQ names the client's QP.
        assert_eq!(conn[3].src, G1);
        assert_eq!(
            (dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn),
            (rep.local_comm_id, req.local_comm_id, req.local_qpn)
        );
        // A reply carries the transaction id of what it answers; the DREQ starts its own.
        assert_eq!(tid(conn[1]), tid(conn[0]));
        assert_eq!(tid(conn[2]), tid(conn[0]));
        assert_ne!(tid(conn[3]), tid(conn[0]));
        assert_eq!(tid(conn[4]), tid(conn[3]));
        // Linux builds it from the sender's comm id (byte-swapped, little-endian host).
        assert_eq!(tid(conn[0]) as u32, req.local_comm_id.swap_bytes());
        assert_eq!(tid(conn[3]) as u32, rep.local_comm_id.swap_bytes());
    }
}

#[test]
fn rping_over_ipv6_link_local_carries_ipv6_gids_and_an_ipv6_rdma_cm_header() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rxe_cm_rping_ipv6.pcap");
    let mut names = vec![];
    let mut req = None;
    for f in read_capture(path).unwrap() {
        let p = parse_frame(&f.data).unwrap();
        assert!(p.icrc_ok());
        let IpRepr::V6 { src, dst, .. } = p.repr.ip else {
            panic!("IPv4 in the IPv6 capture")
        };
        if let Some(m) = gsi_cm_mad(&p.repr.roce) {
            let m = m.unwrap();
            assert_eq!(&m.to_bytes().unwrap()[..], p.repr.roce.payload);
            names.push(m.message.name());
            if let CmMessage::Req(r) = m.message {
                req = Some((r, src, dst));
            }
        }
    }
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    let (req, src, dst) = req.unwrap();
    // The GIDs are the link-local addresses themselves, not IPv4-mapped.
    assert_eq!(req.primary_path.local_gid, src.octets());
    assert_eq!(req.primary_path.remote_gid, dst.octets());
    assert!(src.is_unicast_link_local());
    let hdr = CmaHeader::parse(req.private_data.as_bytes()).unwrap();
    assert_eq!(hdr.ip_version(), 6);
    assert_eq!(
        (hdr.src_addr, hdr.dst_addr),
        (IpAddr::V6(src), IpAddr::V6(dst))
    );
    let mut again = [0u8; 36];
    hdr.emit(&mut again).unwrap();
    assert_eq!(&again[..], &req.private_data.as_bytes()[..36]);
}

// ---------------------------------------------------------------------------------------
// Typed errors, never a panic

fn real_mads() -> Vec<Vec<u8>> {
    [
        "rxe_cm_rping.pcap",
        "rxe_cm_udaddy.pcap",
        "rxe_cm_reject.pcap",
    ]
    .iter()
    .flat_map(|n| frames(n))
    .filter_map(|f| f.mad.map(|(_, b)| b))
    .collect()
}

#[test]
fn truncated_and_foreign_mads_are_typed_errors() {
    for m in real_mads() {
        for len in [0, 1, 23, 24, 100, 255] {
            assert!(matches!(
                CmMad::parse(&m[..len]),
                Err(MadError::Truncated { need: 256, .. })
            ));
        }
        let mut bad = m.clone();
        bad[0] = 2;
        assert_eq!(CmMad::parse(&bad), Err(MadError::BadBaseVersion(2)));
        let mut bad = m.clone();
        bad[2] = 1;
        assert_eq!(CmMad::parse(&bad), Err(MadError::BadClassVersion(1)));
        let mut bad = m.clone();
        bad[3] = 0x81;
        assert_eq!(CmMad::parse(&bad), Err(MadError::BadMethod(0x81)));
        let mut bad = m.clone();
        bad[16..18].copy_from_slice(&0x0020u16.to_be_bytes());
        assert_eq!(CmMad::parse(&bad), Err(MadError::UnknownAttribute(0x20)));
        let mut bad = m;
        bad[16..18].copy_from_slice(&attr::CLASS_PORT_INFO.to_be_bytes());
        assert_eq!(
            CmMad::parse(&bad),
            Err(MadError::UnsupportedAttribute(attr::CLASS_PORT_INFO))
        );
    }
}

#[test]
fn emit_refuses_values_wider_than_their_fields() {
    let req = CmReq {
        local_qpn: 1 << 24,
        ..CmReq::default()
    };
    let mut buf = [0u8; MAD_DATA_LEN];
    assert_eq!(
        CmMessage::Req(req).emit(&mut buf),
        Err(MadError::FieldOutOfRange {
            field: "local_qpn",
            value: 1 << 24
        })
    );
    let mra = CmMra {
        service_timeout: 32,
        ..CmMra::default()
    };
    assert!(CmMessage::Mra(mra).emit(&mut buf).is_err());
    let path = CmPath {
        flow_label: 1 << 20,
        ..CmPath::default()
    };
    let req = CmReq {
        primary_path: path,
        ..CmReq::default()
    };
    assert!(CmMessage::Req(req).emit(&mut buf).is_err());
    assert!(CmMessage::Rtu(CmRtu::default())
        .emit(&mut buf[..231])
        .is_err());
    assert_eq!(
        PrivateData::<92>::from_slice(&[1; 93]),
        Err(MadError::PrivateDataTooLong { len: 93, max: 92 })
    );
    let pd = PrivateData::<92>::from_slice(&[1, 2, 3]).unwrap();
    assert_eq!(&pd.as_bytes()[..4], &[1, 2, 3, 0]);
}

#[test]
fn every_reject_reason_round_trips_its_code() {
    for r in RejectReason::ALL {
        assert_eq!(RejectReason::from_code(r.code()), *r);
    }
    assert_eq!(RejectReason::ALL.len(), 34);
    assert_eq!(RejectReason::from_code(10), RejectReason::StaleConnection);
    assert_eq!(RejectReason::from_code(8), RejectReason::InvalidServiceId);
    assert_eq!(RejectReason::from_code(28), RejectReason::ConsumerDefined);
    assert_eq!(RejectReason::from_code(34), RejectReason::Unknown(34));
}

// ---------------------------------------------------------------------------------------
// Round trips of generated messages

fn bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn private<const N: usize>() -> impl Strategy<Value = PrivateData<N>> {
    bytes::<N>().prop_map(PrivateData)
}

fn path() -> impl Strategy<Value = CmPath> {
    (
        any::<(u16, u16)>(),
        bytes::<16>(),
        bytes::<16>(),
        0u32..1 << 20,
        0u8..64,
        any::<(u8, u8)>(),
        0u8..16,
        any::<bool>(),
        0u8..32,
    )
        .prop_map(|(lids, lg, rg, fl, rate, (tc, hl), sl, sn, ack)| CmPath {
            local_lid: lids.0,
            remote_lid: lids.1,
            local_gid: lg,
            remote_gid: rg,
            flow_label: fl,
            packet_rate: rate,
            traffic_class: tc,
            hop_limit: hl,
            sl,
            subnet_local: sn,
            local_ack_timeout: ack,
        })
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..1 << 24
}

fn req() -> impl Strategy<Value = CmReq> {
    (
        (
            any::<u32>(),
            u24(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        ),
        (u24(), any::<u8>(), u24(), any::<u8>(), u24()),
        (0u8..32, 0u8..4, any::<bool>(), u24(), 0u8..32, 0u8..8),
        (any::<u16>(), 0u8..16, any::<bool>(), 0u8..8, 0u8..16),
        (any::<bool>(), 0u8..8, path(), path(), any::<bool>()),
        private::<92>(),
    )
        .prop_map(|(a, b, c, d, e, private_data)| CmReq {
            local_comm_id: a.0,
            vendor_id: a.1,
            service_id: a.2,
            local_ca_guid: a.3,
            local_qkey: a.4,
            local_qpn: b.0,
            responder_resources: b.1,
            local_eecn: b.2,
            initiator_depth: b.3,
            remote_eecn: b.4,
            remote_cm_response_timeout: c.0,
            transport_type: TransportType::from_code(c.1),
            end_to_end_flow_control: c.2,
            starting_psn: c.3,
            local_cm_response_timeout: c.4,
            retry_count: c.5,
            partition_key: d.0,
            path_mtu: PathMtu::from_code(d.1),
            rdc_exists: d.2,
            rnr_retry_count: d.3,
            max_cm_retries: d.4,
            srq: e.0,
            extended_transport_type: e.1,
            primary_path: e.2,
            alternate_path: e.3,
            sap_supported: e.4,
            private_data,
        })
}

fn rep() -> impl Strategy<Value = CmRep> {
    (
        (any::<u32>(), any::<u32>(), any::<u32>(), u24(), u24()),
        (u24(), u24(), any::<u8>(), any::<u8>(), 0u8..32),
        (0u8..4, any::<bool>(), 0u8..8, any::<bool>(), any::<u64>()),
        private::<196>(),
    )
        .prop_map(|(a, b, c, private_data)| CmRep {
            local_comm_id: a.0,
            remote_comm_id: a.1,
            local_qkey: a.2,
            local_qpn: a.3,
            vendor_id: a.4,
            local_eecn: b.0,
            starting_psn: b.1,
            responder_resources: b.2,
            initiator_depth: b.3,
            target_ack_delay: b.4,
            failover_accepted: FailoverAccepted::from_code(c.0),
            end_to_end_flow_control: c.1,
            rnr_retry_count: c.2,
            srq: c.3,
            local_ca_guid: c.4,
            private_data,
        })
}

fn message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        req().prop_map(CmMessage::Req),
        rep().prop_map(CmMessage::Rep),
        (any::<(u32, u32)>(), 0u8..4, 0u8..32, private::<222>()).prop_map(
            |((l, r), m, t, private_data)| CmMessage::Mra(CmMra {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: MraedMessage::from_code(m),
                service_timeout: t,
                private_data,
            })
        ),
        (
            any::<(u32, u32)>(),
            0u8..4,
            0u8..128,
            any::<u16>(),
            bytes::<72>(),
            private::<148>()
        )
            .prop_map(|((l, r), m, len, reason, ari, private_data)| {
                CmMessage::Rej(CmRej {
                    local_comm_id: l,
                    remote_comm_id: r,
                    message_rejected: RejectedMessage::from_code(m),
                    reject_info_length: len,
                    reason: RejectReason::from_code(reason),
                    ari,
                    private_data,
                })
            }),
        (any::<(u32, u32)>(), private::<224>()).prop_map(|((l, r), private_data)| {
            CmMessage::Rtu(CmRtu {
                local_comm_id: l,
                remote_comm_id: r,
                private_data,
            })
        }),
        (any::<(u32, u32)>(), u24(), private::<220>()).prop_map(|((l, r), q, private_data)| {
            CmMessage::Dreq(CmDreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: q,
                private_data,
            })
        }),
        (any::<(u32, u32)>(), private::<224>()).prop_map(|((l, r), private_data)| {
            CmMessage::Drep(CmDrep {
                local_comm_id: l,
                remote_comm_id: r,
                private_data,
            })
        }),
        (any::<(u32, u16, u64)>(), private::<216>()).prop_map(|((id, pkey, sid), private_data)| {
            CmMessage::SidrReq(SidrReq {
                request_id: id,
                partition_key: pkey,
                service_id: sid,
                private_data,
            })
        }),
        (
            any::<(u32, u8, u8)>(),
            u24(),
            u24(),
            any::<(u64, u32)>(),
            bytes::<72>(),
            private::<136>()
        )
            .prop_map(
                |((id, status, len), vendor_id, qpn, (sid, qkey), info, private_data)| {
                    CmMessage::SidrRep(SidrRep {
                        request_id: id,
                        status: SidrStatus::from_code(status),
                        additional_info_length: len,
                        vendor_id,
                        qpn,
                        service_id: sid,
                        qkey,
                        additional_info: info,
                        private_data,
                    })
                }
            ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_messages_round_trip(m in message(), tid in any::<u64>()) {
        let mad = CmMad::new(tid, m);
        let bytes = mad.to_bytes().unwrap();
        let back = CmMad::parse(&bytes).unwrap();
        prop_assert_eq!(back, mad);
        prop_assert_eq!(back.to_bytes().unwrap(), bytes);
        prop_assert_eq!(MadHeader::cm(m.attribute_id(), tid), back.header);
    }

    #[test]
    fn any_bytes_after_a_cm_header_parse_or_fail_typed(
        attribute_id in 0x000Fu16..0x001C,
        data in bytes::<232>(),
    ) {
        match CmMessage::parse(attribute_id, &data) {
            Ok(m) => {
                let mut again = [0u8; 232];
                m.emit(&mut again).unwrap();
                prop_assert_eq!(CmMessage::parse(attribute_id, &again).unwrap(), m);
            }
            Err(e) => prop_assert!(matches!(
                e,
                MadError::UnknownAttribute(_) | MadError::UnsupportedAttribute(_)
            )),
        }
    }

    #[test]
    fn garbage_never_panics(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMad::parse(&data);
        let _ = CmaHeader::parse(&data);
        for attribute_id in [attr::REQ, attr::REJ, attr::SIDR_REP, attr::LAP] {
            let _ = CmMessage::parse(attribute_id, &data);
        }
    }

    #[test]
    fn cma_headers_round_trip(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), port in any::<u16>(),
                              v6 in any::<bool>(), src6 in any::<[u8; 16]>()) {
        let src_addr = if v6 { IpAddr::from(src6) } else { IpAddr::from(src) };
        let dst_addr = if v6 { IpAddr::from(std::net::Ipv6Addr::from(u128::from(u32::from_be_bytes(dst)) + 1)) } else { IpAddr::from(dst) };
        let h = CmaHeader::new(src_addr, port, dst_addr);
        let mut buf = [0u8; 36];
        h.emit(&mut buf).unwrap();
        prop_assert_eq!(CmaHeader::parse(&buf).unwrap(), h);
    }
}
