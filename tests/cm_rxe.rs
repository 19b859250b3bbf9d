//! xroce's CM agent (`xroce::cm`) in the place of either side of real exchanges with rxe's
//! kernel CM (tests/fixtures/rxe_cm_*.pcap, two rxe guests of the lab, kernel 6.1): fed the
//! MADs rxe sent, it answers with the messages rxe's own peer sent, field for field.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use xroce::capture::read_capture;
use xroce::cm::*;
use xroce::netdev::Gid;
use xroce::wire::cm::{gsi_cm_mad, CmMad, CmMessage, MraedMessage};
use xroce::wire::{parse_frame, IpRepr};

/// The CM MADs of a capture: sender, raw MAD, parsed.
fn mads(name: &str) -> Vec<(MadPeer, Vec<u8>, CmMad)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let mut out = vec![];
    for f in read_capture(path).unwrap() {
        let p = parse_frame(&f.data).unwrap();
        let IpRepr::V4 { src, .. } = p.repr.ip else {
            panic!("IPv6 in {name}")
        };
        if let Some(mad) = gsi_cm_mad(&p.repr.roce) {
            let from = MadPeer {
                gid: Gid::from_ip(IpAddr::V4(src)),
                qpn: 1,
                pkey_index: 0,
                mac: None,
            };
            out.push((from, p.repr.roce.payload.to_vec(), mad.unwrap()));
        }
    }
    out
}

fn sent(agent: &mut CmAgent) -> Vec<CmMad> {
    std::iter::from_fn(|| agent.poll_transmit())
        .map(|out| CmMad::parse(&out.bytes).unwrap())
        .collect()
}

fn one(agent: &mut CmAgent) -> CmMad {
    let mut all = sent(agent);
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0)
}

macro_rules! unpack {
    ($mad:expr, $variant:ident) => {
        match $mad.message {
            CmMessage::$variant(m) => m,
            other => panic!("expected {}, got {other:?}", stringify!($variant)),
        }
    };
}

fn now() -> Instant {
    Instant::from_nanos(1_000_000)
}

/// A ConnectRequest that says what the captured REQ says.
fn request_like(req: &CmReq, to: MadPeer) -> ConnectRequest {
    let path = &req.primary_path;
    ConnectRequest {
        to,
        service_id: req.service_id,
        local_gid: Gid(path.local_gid),
        remote_gid: Gid(path.remote_gid),
        qpn: req.local_qpn,
        starting_psn: req.starting_psn,
        qkey: req.local_qkey,
        transport: req.transport_type,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        path_mtu: req.path_mtu,
        pkey: req.partition_key,
        traffic_class: path.traffic_class,
        hop_limit: path.hop_limit,
        flow_label: path.flow_label,
        sl: path.sl,
        local_ack_timeout: path.local_ack_timeout,
        cm_response_timeout: req.remote_cm_response_timeout,
        max_cm_retries: req.max_cm_retries,
        srq: req.srq,
        private_data: req.private_data.as_bytes().to_vec(),
    }
}

/// An agent that will use the comm id, CA GUID and transaction id the captured side used.
fn agent_like(comm_id: u32, ca_guid: u64, tid: u64, local_cm_response_timeout: u8) -> CmAgent {
    CmAgent::new(CmConfig {
        local_ca_guid: ca_guid,
        first_comm_id: comm_id,
        first_tid: tid,
        local_cm_response_timeout,
        ..CmConfig::default()
    })
}

#[test]
fn as_the_active_side_of_rping_it_sends_what_rxe_sent() {
    let m = mads("rxe_cm_rping.pcap");
    let (client, _, req_mad) = &m[0];
    let (server, rep_bytes, rep_mad) = &m[1];
    let rxe_req = unpack!(req_mad, Req);
    let mut agent = agent_like(
        rxe_req.local_comm_id,
        rxe_req.local_ca_guid,
        req_mad.header.transaction_id,
        rxe_req.local_cm_response_timeout,
    );
    let conn = agent
        .connect(now(), request_like(&rxe_req, *server))
        .unwrap();
    let ours = one(&mut agent);
    assert_eq!(ours.header, req_mad.header);
    let mut expected = rxe_req;
    let our_req = unpack!(ours, Req);
    // What xroce leaves at zero: Linux's ECE vendor id, the path's LIDs, packet rate,
    // subnet-local bit and SAP (alternate paths), none of which RoCE uses.
    expected.vendor_id = 0;
    expected.primary_path.local_lid = our_req.primary_path.local_lid;
    expected.primary_path.remote_lid = our_req.primary_path.remote_lid;
    expected.primary_path.packet_rate = our_req.primary_path.packet_rate;
    expected.primary_path.subnet_local = our_req.primary_path.subnet_local;
    expected.sap_supported = our_req.sap_supported;
    expected.end_to_end_flow_control = our_req.end_to_end_flow_control;
    assert_eq!(our_req, expected);

    // rxe's REP, then our RTU: the same MAD rxe's client sent, byte for byte.
    agent.handle_mad(now(), *server, rep_bytes);
    let Some(CmEvent::RepReceived { conn: c, rep }) = agent.poll_event() else {
        panic!("no RepReceived")
    };
    assert_eq!((c, rep), (conn, unpack!(rep_mad, Rep)));
    let (_, rtu_bytes, rtu_mad) = &m[2];
    let rtu = unpack!(rtu_mad, Rtu);
    agent
        .send_rtu(now(), conn, rtu.private_data.as_bytes())
        .unwrap();
    let out = agent.poll_transmit().unwrap();
    assert_eq!(out.bytes[..], rtu_bytes[..256]);
    assert_eq!(agent.poll_event(), Some(CmEvent::Established { conn }));

    // Our DREQ: rxe's but for the transaction id, which is the CM's own choice.
    let (_, _, dreq_mad) = &m[3];
    let (_, drep_bytes, _) = &m[4];
    agent
        .disconnect(now(), conn, unpack!(dreq_mad, Dreq).private_data.as_bytes())
        .unwrap();
    let ours = one(&mut agent);
    assert_eq!(ours.message, dreq_mad.message);
    // rxe's DREP answers the transaction rxe's client started, not ours: still taken.
    agent.handle_mad(now(), *server, drep_bytes);
    assert!(matches!(
        agent.poll_event(),
        Some(CmEvent::Disconnected {
            timed_out: false,
            ..
        })
    ));
    assert_eq!(agent.state(conn), Some(State::TimeWait));
    assert_eq!(client.gid, Gid(expected.primary_path.local_gid));
}

#[test]
fn as_the_passive_side_of_rping_it_sends_what_rxe_sent() {
    let m = mads("rxe_cm_rping.pcap");
    let (client, req_bytes, req_mad) = &m[0];
    let (_, _, rep_mad) = &m[1];
    let rxe_rep = unpack!(rep_mad, Rep);
    let mut agent = agent_like(rxe_rep.local_comm_id, rxe_rep.local_ca_guid, 1, 20);
    let req = unpack!(req_mad, Req);
    agent.listen(req.service_id, None).unwrap();
    agent.handle_mad(now(), *client, req_bytes);
    let Some(CmEvent::ReqReceived {
        conn,
        req: got,
        from,
        ..
    }) = agent.poll_event()
    else {
        panic!("no ReqReceived")
    };
    assert_eq!(got, req);
    assert_eq!(from, *client);
    agent
        .accept(
            now(),
            conn,
            ReplyParams {
                qpn: rxe_rep.local_qpn,
                starting_psn: rxe_rep.starting_psn,
                qkey: rxe_rep.local_qkey,
                responder_resources: rxe_rep.responder_resources,
                initiator_depth: rxe_rep.initiator_depth,
                target_ack_delay: rxe_rep.target_ack_delay,
                end_to_end_flow_control: rxe_rep.end_to_end_flow_control,
                rnr_retry_count: rxe_rep.rnr_retry_count,
                srq: rxe_rep.srq,
                private_data: rxe_rep.private_data.as_bytes().to_vec(),
            },
        )
        .unwrap();
    let ours = one(&mut agent);
    assert_eq!(ours.header, rep_mad.header);
    let mut expected = rxe_rep;
    let our_rep = unpack!(ours, Rep);
    expected.vendor_id = 0;
    expected.failover_accepted = our_rep.failover_accepted;
    assert_eq!(our_rep, expected);

    // rxe's RTU, DREQ; our DREP is rxe's server's, byte for byte.
    let (_, rtu_bytes, _) = &m[2];
    agent.handle_mad(now(), *client, rtu_bytes);
    assert_eq!(agent.poll_event(), Some(CmEvent::Established { conn }));
    let (_, dreq_bytes, _) = &m[3];
    agent.handle_mad(now(), *client, dreq_bytes);
    assert!(matches!(
        agent.poll_event(),
        Some(CmEvent::DisconnectRequested { .. })
    ));
    let (_, drep_bytes, drep_mad) = &m[4];
    agent
        .disconnect(now(), conn, unpack!(drep_mad, Drep).private_data.as_bytes())
        .unwrap();
    let out = agent.poll_transmit().unwrap();
    assert_eq!(out.bytes[..], drep_bytes[..256]);
    // rxe's client resending its DREQ now gets the DREP again.
    agent.handle_mad(now(), *client, dreq_bytes);
    assert_eq!(one(&mut agent).message, drep_mad.message);
    assert_eq!(agent.stats().dropped_malformed, 0);
}

#[test]
fn rxe_s_reject_for_a_port_nobody_listens_on_ends_our_connect() {
    let m = mads("rxe_cm_reject.pcap");
    let (_, _, req_mad) = &m[0];
    let (server, rej_bytes, _) = &m[1];
    let req = unpack!(req_mad, Req);
    let mut agent = agent_like(req.local_comm_id, req.local_ca_guid, 1, 20);
    let conn = agent.connect(now(), request_like(&req, *server)).unwrap();
    sent(&mut agent);
    agent.handle_mad(now(), *server, rej_bytes);
    assert!(matches!(
        agent.poll_event(),
        Some(CmEvent::Rejected { conn: c, reason: RejectReason::InvalidServiceId, from_peer: true, .. })
            if c == conn
    ));
    assert_eq!(agent.connection_count(), 0);

    // And our passive side answers rxe's REQ for that port as rxe did.
    let mut passive = CmAgent::new(CmConfig::default());
    let (client, req_bytes, _) = &m[0];
    passive.handle_mad(now(), *client, req_bytes);
    let ours = one(&mut passive);
    let theirs = CmMad::parse(rej_bytes).unwrap();
    assert_eq!(ours.header, theirs.header);
    assert_eq!(ours.message, theirs.message);
}

#[test]
fn rxe_s_mra_for_a_busy_listener_holds_our_req() {
    let m = mads("rxe_cm_slow_accept.pcap");
    let (_, _, req_mad) = &m[0];
    let (server, mra_bytes, mra_mad) = &m[2];
    assert_eq!(unpack!(mra_mad, Mra).message_mraed, MraedMessage::Req);
    let req = unpack!(req_mad, Req);
    let mut agent = agent_like(
        req.local_comm_id,
        req.local_ca_guid,
        req_mad.header.transaction_id,
        20,
    );
    let conn = agent.connect(now(), request_like(&req, *server)).unwrap();
    sent(&mut agent);
    agent.handle_mad(now(), *server, mra_bytes);
    assert_eq!(
        agent.poll_event(),
        Some(CmEvent::MraReceived {
            conn,
            service_timeout: iba_time(24)
        })
    );
    // 68.7 s + one packet lifetime before the REQ goes again.
    assert_eq!(
        agent.poll_timeout(),
        Some(now() + iba_time(24) + iba_time(18))
    );
    assert_eq!(agent.stats().clamped_timeouts, 0);
    let (_, rep_bytes, _) = &m[3];
    agent.handle_mad(now() + Duration::from_secs(14), *server, rep_bytes);
    assert!(matches!(
        agent.poll_event(),
        Some(CmEvent::RepReceived { .. })
    ));
    assert_eq!(agent.state(conn), Some(State::RepRcvd));
}

#[test]
fn udaddy_s_sidr_both_ways() {
    let m = mads("rxe_cm_udaddy.pcap");
    let (client, sidr_req_bytes, req_mad) = &m[0];
    let (server, sidr_rep_bytes, rep_mad) = &m[1];
    let req = unpack!(req_mad, SidrReq);
    let rep = unpack!(rep_mad, SidrRep);

    // Active: our SIDR_REQ with rxe's request id, then rxe's answer.
    let mut active = agent_like(req.request_id, 0, req_mad.header.transaction_id, 20);
    let sidr = active
        .sidr_request(
            now(),
            SidrRequest {
                to: *server,
                service_id: req.service_id,
                pkey: req.partition_key,
                timeout: 20,
                max_retries: 3,
                private_data: req.private_data.as_bytes().to_vec(),
            },
        )
        .unwrap();
    assert_eq!(one(&mut active), *req_mad);
    active.handle_mad(now(), *server, sidr_rep_bytes);
    match active.poll_event() {
        Some(CmEvent::SidrRepReceived {
            sidr: s,
            status,
            qpn,
            qkey,
            ..
        }) => {
            assert_eq!(s, sidr);
            assert_eq!(status, rep.status);
            assert_eq!((qpn, qkey), (rep.qpn, rep.qkey));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(active.poll_timeout(), None);

    // Passive: rxe's SIDR_REQ, our SIDR_REP as rxe's server sent it.
    let mut passive = CmAgent::new(CmConfig::default());
    passive.listen(req.service_id, None).unwrap();
    passive.handle_mad(now(), *client, sidr_req_bytes);
    let Some(CmEvent::SidrReqReceived { sidr, .. }) = passive.poll_event() else {
        panic!("no SidrReqReceived")
    };
    passive
        .sidr_reply(
            now(),
            sidr,
            SidrReply {
                status: rep.status,
                qpn: rep.qpn,
                qkey: rep.qkey,
                private_data: rep.private_data.as_bytes().to_vec(),
            },
        )
        .unwrap();
    let ours = one(&mut passive);
    assert_eq!(ours.header, rep_mad.header);
    let mut expected = rep;
    expected.vendor_id = 0;
    assert_eq!(unpack!(ours, SidrRep), expected);
}

#[test]
fn as_the_ucmatose_server_it_takes_three_interleaved_connections_and_disconnects_them() {
    // rxe_cm_ucmatose.pcap: three REQ/REP pairs, then the three RTUs; the server sends the
    // DREQs. Our agent is the server; rxe's client's MADs name rxe's server comm ids, which
    // are translated to ours before they are fed in.
    let m = mads("rxe_cm_ucmatose.pcap");
    let server_guid = m
        .iter()
        .find_map(|(_, _, mad)| match mad.message {
            CmMessage::Rep(rep) => Some(rep.local_ca_guid),
            _ => None,
        })
        .unwrap();
    let mut agent = CmAgent::new(CmConfig {
        local_ca_guid: server_guid,
        ..CmConfig::default()
    });
    // rxe's server comm id → ours, and the client's comm id → ours.
    let mut ours_of: std::collections::HashMap<u32, ConnId> = Default::default();
    let mut by_client: std::collections::HashMap<u32, ConnId> = Default::default();
    let mut listening = false;
    let mut client_peer = None;
    let mut established = 0;
    for (from, bytes, mad) in &m {
        let from_client = match mad.message {
            CmMessage::Req(_) | CmMessage::Rtu(_) | CmMessage::Drep(_) => true,
            CmMessage::Rep(_) | CmMessage::Dreq(_) => false,
            other => panic!("{other:?}"),
        };
        if !from_client {
            // What rxe's server sent: ours must say the same but for comm id and tid.
            match mad.message {
                CmMessage::Rep(rep) => {
                    let conn = by_client[&rep.remote_comm_id];
                    assert_eq!(agent.state(conn), Some(State::ReqRcvd));
                    ours_of.insert(rep.local_comm_id, conn);
                    agent
                        .accept(
                            now(),
                            conn,
                            ReplyParams {
                                qpn: rep.local_qpn,
                                starting_psn: rep.starting_psn,
                                qkey: rep.local_qkey,
                                responder_resources: rep.responder_resources,
                                initiator_depth: rep.initiator_depth,
                                target_ack_delay: rep.target_ack_delay,
                                end_to_end_flow_control: rep.end_to_end_flow_control,
                                rnr_retry_count: rep.rnr_retry_count,
                                srq: rep.srq,
                                private_data: rep.private_data.as_bytes().to_vec(),
                            },
                        )
                        .unwrap();
                    let mut ours = unpack!(one(&mut agent), Rep);
                    assert_eq!(ours.local_comm_id, conn.0);
                    ours.local_comm_id = rep.local_comm_id;
                    ours.vendor_id = rep.vendor_id;
                    ours.failover_accepted = rep.failover_accepted;
                    assert_eq!(ours, rep);
                }
                CmMessage::Dreq(dreq) => {
                    let conn = ours_of[&dreq.local_comm_id];
                    agent
                        .disconnect(now(), conn, dreq.private_data.as_bytes())
                        .unwrap();
                    let mut ours = unpack!(one(&mut agent), Dreq);
                    ours.local_comm_id = dreq.local_comm_id;
                    assert_eq!(ours, dreq);
                }
                _ => unreachable!(),
            }
            continue;
        }
        let mut translated = *mad;
        match &mut translated.message {
            CmMessage::Req(req) if !listening => {
                agent.listen(req.service_id, None).unwrap();
                listening = true;
            }
            CmMessage::Rtu(rtu) => rtu.remote_comm_id = ours_of[&rtu.remote_comm_id].0,
            CmMessage::Drep(drep) => drep.remote_comm_id = ours_of[&drep.remote_comm_id].0,
            _ => {}
        }
        assert_eq!(CmMad::parse(bytes).unwrap(), *mad);
        client_peer = Some(*from);
        agent.handle_mad(now(), *from, &translated.to_bytes().unwrap());
        while let Some(event) = agent.poll_event() {
            match event {
                CmEvent::ReqReceived { conn, req, .. } => {
                    by_client.insert(req.local_comm_id, conn);
                }
                CmEvent::Established { .. } => established += 1,
                CmEvent::Disconnected {
                    timed_out: false, ..
                } => {}
                other => panic!("{other:?}"),
            }
        }
        assert!(sent(&mut agent).is_empty());
    }
    assert_eq!(established, 3);
    assert!(client_peer.is_some());
    assert_eq!(agent.connection_count(), 3);
    for conn in ours_of.values() {
        assert_eq!(agent.state(*conn), Some(State::TimeWait));
    }
    assert_eq!(agent.stats().dropped_unknown_connection, 0);
    assert_eq!(agent.stats().dropped_mismatch, 0);
}
