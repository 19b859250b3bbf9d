//! Conformance against Linux soft-RoCE from real captures: the engine takes the place of one
//! rxe host, is fed the other host's request packets exactly as they were captured, and must
//! answer with the ACKs rxe sent — same opcode, PSN, syndrome, MSN, destination QP, UDP source
//! port (rxe's flow-label rule) and hop limit.
use std::net::IpAddr;
use std::time::Duration;

use xroce::capture::read_capture;
use xroce::engine::*;
use xroce::wire::{self, IpRepr, Opcode};

struct Frame {
    ts: Duration,
    src: IpAddr,
    mac_src: [u8; 6],
    mac_dst: [u8; 6],
    ttl: u8,
    udp_src_port: u16,
    dest_qp: u32,
    opcode: Opcode,
    psn: u32,
    syndrome: Option<u8>,
    msn: Option<u32>,
    is_request: bool,
    bytes: Vec<u8>,
}

fn load(name: &str) -> Vec<Frame> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for f in read_capture(&path).unwrap() {
        let Ok(p) = wire::parse_frame_verified(&f.data) else {
            continue;
        };
        let (src, ttl) = match p.ip {
            IpRepr::V4 { src, ttl, .. } => (IpAddr::V4(src), ttl),
            IpRepr::V6 { src, hop_limit, .. } => (IpAddr::V6(src), hop_limit),
        };
        let info = p.roce.bth.opcode.info().unwrap();
        out.push(Frame {
            ts: f.timestamp,
            src,
            mac_src: p.eth.src,
            mac_dst: p.eth.dst,
            ttl,
            udp_src_port: p.udp_src_port,
            dest_qp: p.roce.bth.dest_qp,
            opcode: p.roce.bth.opcode,
            psn: p.roce.bth.psn.value(),
            syndrome: p.roce.aeth.map(|a| a.syndrome.to_byte()),
            msn: p.roce.aeth.map(|a| a.msn),
            is_request: info.is_request,
            bytes: f.data.clone(),
        });
    }
    out
}

/// The engine plays host `me`; returns (ACKs the engine sent, ACKs rxe sent) as comparable
/// tuples.
fn replay(frames: &[Frame], me: IpAddr, mtu: Mtu) -> (Vec<String>, Vec<String>) {
    let to_me: Vec<&Frame> = frames.iter().filter(|f| f.src != me).collect();
    let from_me: Vec<&Frame> = frames.iter().filter(|f| f.src == me).collect();
    let first_req = to_me.iter().find(|f| f.is_request).expect("peer requests");
    let my_qpn = first_req.dest_qp;
    let peer_qpn = from_me.iter().map(|f| f.dest_qp).next().expect("my frames");
    let my_mac = first_req.mac_dst;
    let peer = first_req.src;
    let mut e = Engine::new(EngineConfig::new(my_mac, me));
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let qp = e
        .create_qp_with_qpn(
            QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps {
                    max_recv_wr: 1024,
                    ..QpCaps::default()
                },
                sq_sig_all: false,
                srq: None,
            },
            my_qpn,
        )
        .unwrap();
    let mr = e.reg_mr(pd, 1 << 16, Access::ALL).unwrap();
    use QpAttrMask as M;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &attr,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let mut av = AddressVector::new(first_req.mac_src, peer);
    av.hop_limit = from_me[0].ttl;
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = Some(av);
    attr.path_mtu = mtu;
    attr.dest_qp_num = peer_qpn;
    attr.rq_psn = first_req.psn;
    e.modify_qp(
        qp,
        &attr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    for i in 0..1000 {
        e.post_recv(
            qp,
            &RecvWr {
                wr_id: i,
                sg_list: vec![Sge {
                    addr: mr.addr,
                    length: 8192,
                    lkey: mr.lkey,
                }],
            },
        )
        .unwrap();
    }
    let mut ours = Vec::new();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    for f in to_me.iter().filter(|f| f.is_request) {
        let now = Instant::from_elapsed(f.ts);
        e.handle_frame(now, &f.bytes);
        while let Some(n) = e.poll_transmit(now, &mut buf) {
            let p = wire::parse_frame_verified(&buf[..n]).unwrap();
            let ttl = match p.ip {
                IpRepr::V4 { ttl, .. } => ttl,
                IpRepr::V6 { hop_limit, .. } => hop_limit,
            };
            let a = p.roce.aeth.unwrap();
            ours.push(format!(
                "{:?} qp {:#x} psn {} syndrome {:#04x} msn {} sport {:#x} ttl {}",
                p.roce.bth.opcode,
                p.roce.bth.dest_qp,
                p.roce.bth.psn.value(),
                a.syndrome.to_byte(),
                a.msn,
                p.udp_src_port,
                ttl
            ));
        }
    }
    let theirs = from_me
        .iter()
        .filter(|f| f.opcode == Opcode::RC_ACKNOWLEDGE)
        .map(|f| {
            format!(
                "{:?} qp {:#x} psn {} syndrome {:#04x} msn {} sport {:#x} ttl {}",
                f.opcode,
                f.dest_qp,
                f.psn,
                f.syndrome.unwrap(),
                f.msn.unwrap(),
                f.udp_src_port,
                f.ttl
            )
        })
        .collect();
    // Nothing dropped except out-of-sequence packets after the one NAK for their gap.
    let mut drops = e.counters().drops.clone();
    drops.out_of_seq_silent = 0;
    assert_eq!(drops, DropCounters::default(), "nothing else dropped");
    (ours, theirs)
}

fn check(name: &str, mtu: Mtu) {
    let frames = load(name);
    let hosts: Vec<IpAddr> = {
        let mut h: Vec<IpAddr> = frames.iter().map(|f| f.src).collect();
        h.sort();
        h.dedup();
        h
    };
    assert_eq!(hosts.len(), 2, "{name}: two hosts");
    for me in hosts {
        let (ours, theirs) = replay(&frames, me, mtu);
        assert!(!theirs.is_empty(), "{name}: rxe sent ACKs");
        assert_eq!(
            ours, theirs,
            "{name}: the engine as {me} answers as rxe did"
        );
    }
}

#[test]
fn acks_match_rxe_in_rc_pingpong() {
    check("rxe_rc_pingpong.pcap", Mtu::Mtu1024);
}

#[test]
fn acks_match_rxe_in_send_lat() {
    check("rxe_send_lat.pcap", Mtu::Mtu1024);
}

/// rxe (198.18.0.11) against a peer that lost one of its own packets: rxe NAKs the gap once
/// (PSN sequence error), stays silent for the rest of it, and ACKs after the go-back-N resend.
/// The engine in rxe's place must send the same NAK and ACKs.
#[test]
fn sequence_nak_matches_rxe_after_a_loss() {
    let frames = load("rxe_host_peer_loss.pcap");
    let rxe: IpAddr = "198.18.0.11".parse().unwrap();
    let (ours, theirs) = replay(&frames, rxe, Mtu::Mtu1024);
    assert!(
        theirs.iter().any(|a| a.contains("syndrome 0x60")),
        "the capture has the NAK"
    );
    assert_eq!(ours, theirs);
}
