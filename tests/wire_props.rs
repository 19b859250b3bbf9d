//! Property tests of the wire model: header and frame round trips, PSN serial arithmetic
//! across the 2^24 wrap, the ICRC's coverage bit by bit, and "no input panics".

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use proptest::prelude::*;
use xroce::capture::read_capture;
use xroce::wire::*;

// ---------------------------------------------------------------------------------------
// Strategies

fn bth_strategy(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (
        any::<[bool; 6]>(),
        any::<u16>(),
        0u32..1 << 24,
        0u32..1 << 24,
    )
        .prop_map(move |(b, pkey, dest_qp, psn)| BthRepr {
            opcode,
            solicited: b[0],
            migreq: b[1],
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: b[2],
            becn: b[3],
            dest_qp,
            ack_req: b[4],
            psn: Psn::new(psn),
        })
}

fn reth() -> impl Strategy<Value = RethRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, dma_len)| RethRepr {
        va,
        rkey,
        dma_len,
    })
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    any::<u8>().prop_map(Syndrome::from_byte)
}

fn aeth() -> impl Strategy<Value = AethRepr> {
    (syndrome(), 0u32..1 << 24).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn })
}

fn atomic_eth() -> impl Strategy<Value = AtomicEthRepr> {
    (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
        |(va, rkey, swap_add, compare)| AtomicEthRepr {
            va,
            rkey,
            swap_add,
            compare,
        },
    )
}

fn deth() -> impl Strategy<Value = DethRepr> {
    (any::<u32>(), 0u32..1 << 24).prop_map(|(qkey, src_qp)| DethRepr { qkey, src_qp })
}

/// A RoCE packet for any opcode in the table, with exactly the headers it needs; the
/// payload is returned separately because `PacketRepr` borrows it.
#[derive(Debug, Clone)]
struct OwnedPacket {
    bth: BthRepr,
    reth: Option<RethRepr>,
    aeth: Option<AethRepr>,
    atomic_eth: Option<AtomicEthRepr>,
    atomic_ack_eth: Option<AtomicAckEthRepr>,
    immdt: Option<u32>,
    ieth: Option<u32>,
    deth: Option<DethRepr>,
    payload: Vec<u8>,
}

impl OwnedPacket {
    fn repr(&self) -> PacketRepr<'_> {
        PacketRepr {
            bth: self.bth,
            reth: self.reth,
            aeth: self.aeth,
            atomic_eth: self.atomic_eth,
            atomic_ack_eth: self.atomic_ack_eth,
            immdt: self.immdt,
            ieth: self.ieth,
            deth: self.deth,
            payload: &self.payload,
        }
    }
}

fn packet() -> impl Strategy<Value = OwnedPacket> {
    let infos: Vec<&'static OpcodeInfo> = known_opcodes().collect();
    proptest::sample::select(infos).prop_flat_map(|info| {
        let payload = if info.transport == Transport::Cnp {
            Just(vec![0u8; CNP_BODY_LEN]).boxed()
        } else if info.has_payload {
            proptest::collection::vec(any::<u8>(), 0..300).boxed()
        } else {
            Just(vec![]).boxed()
        };
        (
            bth_strategy(info.opcode),
            reth(),
            aeth(),
            atomic_eth(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            deth(),
            payload,
        )
            .prop_map(move |(mut bth, r, a, at, ack, imm, ie, d, payload)| {
                bth.pad_count = pad_for(payload.len());
                OwnedPacket {
                    bth,
                    reth: info.has_reth.then_some(r),
                    aeth: info.has_aeth.then_some(a),
                    atomic_eth: info.has_atomic_eth.then_some(at),
                    atomic_ack_eth: info
                        .has_atomic_ack_eth
                        .then_some(AtomicAckEthRepr { orig_data: ack }),
                    immdt: info.has_immdt.then_some(imm),
                    ieth: info.has_ieth.then_some(ie),
                    deth: info.has_deth.then_some(d),
                    payload,
                }
            })
    })
}

fn eth() -> impl Strategy<Value = EthRepr> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
    )
        .prop_map(|(dst, src, vlan)| EthRepr {
            dst,
            src,
            vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
        })
}

fn ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>()
        )
            .prop_map(|(s, d, tos, ttl, ident, df)| IpRepr::V4 {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                tos,
                ttl,
                ident,
                dont_fragment: df
            }),
        (
            any::<u128>(),
            any::<u128>(),
            any::<u8>(),
            0u32..1 << 20,
            any::<u8>()
        )
            .prop_map(|(s, d, traffic_class, flow_label, hop_limit)| IpRepr::V6 {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class,
                flow_label,
                hop_limit
            }),
    ]
}

fn frame() -> impl Strategy<Value = (EthRepr, IpRepr, u16, OwnedPacket)> {
    (eth(), ip(), any::<u16>(), packet())
}

fn emit_frame(eth: EthRepr, ip: IpRepr, port: u16, p: &OwnedPacket) -> Vec<u8> {
    let f = FrameRepr {
        eth,
        ip,
        udp_src_port: port,
        roce: p.repr(),
    };
    let mut buf = vec![0u8; f.buffer_len()];
    let n = f.emit(&mut buf).expect("emit");
    assert_eq!(n, buf.len());
    buf
}

// ---------------------------------------------------------------------------------------
// Round trips

proptest! {
    #[test]
    fn headers_round_trip(
        bth in bth_strategy(Opcode::RC_SEND_ONLY).prop_flat_map(|b| (Just(b), 0u8..4)),
        r in reth(), a in aeth(), at in atomic_eth(), d in deth(), orig in any::<u64>(), imm in any::<u32>(),
    ) {
        let (mut bth, pad) = bth;
        bth.pad_count = pad;
        let mut b = [0u8; BTH_LEN];
        bth.emit(&mut Bth::new_unchecked(&mut b[..]));
        prop_assert_eq!(BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()), Ok(bth));

        let mut b = [0u8; RETH_LEN];
        r.emit(&mut Reth::new_unchecked(&mut b[..]));
        prop_assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), Ok(r));

        let mut b = [0u8; AETH_LEN];
        a.emit(&mut Aeth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(a));

        let mut b = [0u8; ATOMIC_ETH_LEN];
        at.emit(&mut AtomicEth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()), Ok(at));

        let ack = AtomicAckEthRepr { orig_data: orig };
        let mut b = [0u8; ATOMIC_ACK_ETH_LEN];
        ack.emit(&mut AtomicAckEth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap()), Ok(ack));

        let mut b = [0u8; DETH_LEN];
        d.emit(&mut Deth::new_unchecked(&mut b[..]));
        prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), Ok(d));

        let mut b = [0u8; IMM_LEN];
        ImmDt::new_unchecked(&mut b[..]).set_value(imm);
        prop_assert_eq!(ImmDt::new_checked(&b[..]).unwrap().value(), imm);
    }

    #[test]
    fn packets_round_trip(p in packet()) {
        let repr = p.repr();
        let mut buf = vec![0u8; repr.buffer_len()];
        prop_assert_eq!(repr.emit(&mut buf), Ok(buf.len()));
        prop_assert_eq!(buf.len() % 4, 0);
        prop_assert_eq!(PacketRepr::parse(&buf), Ok(repr));
    }

    #[test]
    fn frames_round_trip((eth, ip, port, p) in frame()) {
        let bytes = emit_frame(eth, ip, port, &p);
        let parsed = parse_frame(&bytes).unwrap();
        prop_assert!(parsed.icrc_ok());
        prop_assert!(parsed.ipv4_checksum_ok);
        let want = FrameRepr { eth, ip, udp_src_port: port, roce: p.repr() };
        prop_assert_eq!(parsed.repr, want);
        prop_assert_eq!(parse_frame_verified(&bytes), Ok(want));
        let mut again = vec![0u8; bytes.len()];
        parsed.emit_as_received(&mut again).unwrap();
        prop_assert_eq!(again, bytes);
    }
}

// ---------------------------------------------------------------------------------------
// PSN arithmetic across the wrap

proptest! {
    #[test]
    fn psn_serial_arithmetic(a in 0u32..1 << 24, n in 0u32..1 << 23) {
        let p = Psn::new(a);
        let q = p.wrapping_add(n);
        prop_assert_eq!(q.value(), (a + n) % (1 << 24));
        prop_assert_eq!(q.wrapping_sub(n), p);
        prop_assert_eq!(p.distance_to(q), n as i32);
        prop_assert_eq!(q.distance_to(p), -(n as i32));
        prop_assert_eq!(q.is_after(p), n > 0);
        prop_assert_eq!(p.is_before(q), n > 0);
        prop_assert!(!q.is_before(p));
        // Exactly half the space apart: by convention "before", never both.
        let h = p.wrapping_add(1 << 23);
        prop_assert_eq!(p.distance_to(h), -(1 << 23));
        prop_assert!(!(h.is_after(p) && p.is_after(h)));
    }

    #[test]
    fn psn_near_the_wrap(back in 1u32..1000, fwd in 0u32..1000) {
        let before = Psn::MAX.wrapping_sub(back - 1); // 2^24 - back
        let after = Psn::new(fwd);
        prop_assert!(before.is_before(after));
        prop_assert_eq!(before.distance_to(after), (back + fwd) as i32);
        prop_assert_eq!(before.wrapping_add(back + fwd), after);
    }
}

// ---------------------------------------------------------------------------------------
// ICRC coverage, bit by bit

/// Byte offsets (from the frame start) of the ICRC-masked variant fields.
fn masked_offsets(f: &ParsedFrame<'_>) -> Vec<usize> {
    let ip = f.offsets.ip;
    let mut v = match f.repr.ip {
        IpRepr::V4 { .. } => vec![ip + 1, ip + 8, ip + 10, ip + 11],
        IpRepr::V6 { .. } => vec![ip + 1, ip + 2, ip + 3, ip + 7],
    };
    v.extend([f.offsets.udp + 6, f.offsets.udp + 7, f.offsets.bth + 4]);
    v
}

/// Checks every bit of the frame from the IP header to the ICRC: a flip in a covered byte
/// must make verification fail; a flip in a masked field must not.
fn check_every_bit(bytes: &[u8]) {
    let f = parse_frame(bytes).unwrap();
    assert!(f.icrc_ok());
    let masked = masked_offsets(&f);
    let ipv6_first = matches!(f.repr.ip, IpRepr::V6 { .. }).then_some(f.offsets.ip);
    let mut copy = bytes.to_vec();
    for at in f.offsets.ip..f.offsets.end {
        for bit in 0..8 {
            copy[at] ^= 1 << bit;
            let result = parse_frame_verified(&copy);
            // IPv6 byte 0: the high nibble is the version (covered), the low nibble the
            // start of the traffic class (masked).
            let is_masked = masked.contains(&at) || (Some(at) == ipv6_first && bit < 4);
            if is_masked {
                assert!(
                    result.is_ok(),
                    "masked byte {at} bit {bit} broke verification: {result:?}"
                );
            } else {
                assert!(
                    result.is_err(),
                    "flip of covered byte {at} bit {bit} went unnoticed"
                );
            }
            copy[at] ^= 1 << bit;
        }
    }
}

#[test]
fn every_covered_bit_of_real_frames_is_protected() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut checked = 0;
    for name in [
        "rxe_rc_pingpong.pcap",
        "rxe_ud_pingpong.pcap",
        "rxe_read_lat.pcap",
        "rxe_write_lat.pcap",
        "rxe_host_peer_loss.pcap",
    ] {
        // The first few RoCE frames of each opcode in the file.
        let mut per_opcode = std::collections::HashMap::new();
        for f in read_capture(dir.join(name)).unwrap() {
            if let Ok(p) = parse_frame(&f.data) {
                let seen = per_opcode.entry(p.repr.roce.bth.opcode).or_insert(0);
                if *seen < 2 && f.data.len() <= 700 {
                    *seen += 1;
                    check_every_bit(&f.data);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_covered_bit_of_generated_frames_is_protected((eth, ip, port, mut p) in frame()) {
        p.payload.truncate(40);
        if p.bth.opcode == Opcode::CNP {
            p.payload = vec![0; CNP_BODY_LEN];
        }
        check_every_bit(&emit_frame(eth, ip, port, &p));
    }
}

// ---------------------------------------------------------------------------------------
// No input panics

fn real_frames() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v = vec![];
    for name in [
        "rxe_rc_pingpong.pcap",
        "rxe_ud_pingpong.pcap",
        "rxe_read_lat.pcap",
        "rxe_host_peer_loss.pcap",
    ] {
        v.extend(
            read_capture(dir.join(name))
                .unwrap()
                .into_iter()
                .map(|f| f.data),
        );
    }
    v
}

/// Whatever parses must re-emit and parse back to the same thing.
fn parse_is_consistent(bytes: &[u8]) {
    let _ = PacketRepr::parse(bytes);
    let _ = frame_icrc(bytes);
    let verified = parse_frame_verified(bytes);
    match parse_frame(bytes) {
        Ok(p) => {
            assert_eq!(verified.is_ok(), p.icrc_ok());
            let mut buf = vec![0u8; p.repr.buffer_len()];
            p.repr
                .emit(&mut buf)
                .expect("a parsed frame can be emitted");
            let again = parse_frame(&buf).expect("an emitted frame parses");
            assert!(again.icrc_ok());
            assert_eq!(again.repr, p.repr);
        }
        Err(_) => assert!(verified.is_err()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        parse_is_consistent(&bytes);
    }

    #[test]
    fn mutated_real_frames_never_panic(
        pick in any::<proptest::sample::Index>(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        extra in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        thread_local!(static FRAMES: Vec<Vec<u8>> = real_frames());
        let mut bytes = FRAMES.with(|f| pick.get(f).clone());
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        bytes.extend(extra);
        parse_is_consistent(&bytes);
    }

    #[test]
    fn mutated_headers_of_real_frames_never_panic(
        pick in any::<proptest::sample::Index>(),
        edits in proptest::collection::vec((0usize..80, any::<u8>()), 1..4),
    ) {
        // Mutations focused on the headers, where the length fields are.
        thread_local!(static FRAMES: Vec<Vec<u8>> = real_frames());
        let mut bytes = FRAMES.with(|f| pick.get(f).clone());
        for (at, value) in edits {
            if at < bytes.len() {
                bytes[at] = value;
            }
        }
        parse_is_consistent(&bytes);
    }
}
