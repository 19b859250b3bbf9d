//! Hostile input for an engine with connected QPs: arbitrary bytes, mutated real frames, and
//! well-formed packets (valid ICRC) with random opcodes, PSNs, keys and lengths. Nothing may
//! panic; everything is a counted drop, a NAK or a completion status.
#[path = "common/hostile.rs"]
mod hostile;
#[path = "common/pair.rs"]
mod pair;

use std::time::Duration;

use hostile::{receive_trace, still_serves};
use pair::{Pair, PairOptions};
use proptest::prelude::*;
use xroce::engine::*;
use xroce::sim::workload::{IP_A, IP_B, MAC_A, MAC_B};
use xroce::wire::*;

/// Real frames of a short exchange (requests and responses).
fn sample_frames() -> Vec<Vec<u8>> {
    let mut p = Pair::new(PairOptions::default());
    let s = p.sge_a(0, 3000);
    p.post_recv_b(1, 0, 4096);
    p.post_a(1, WrOp::Send, vec![s]);
    let (va, rkey) = (p.mr_b.addr, p.mr_b.rkey);
    p.post_a(
        2,
        WrOp::Read {
            remote_addr: va,
            rkey,
        },
        vec![s],
    );
    let s8 = p.sge_a(0, 8);
    p.post_a(
        3,
        WrOp::FetchAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        vec![s8],
    );
    let frames = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let f2 = frames.clone();
    p.net.set_filter(move |f| {
        f2.borrow_mut().push(f.bytes.to_vec());
        xroce::sim::Verdict::Pass
    });
    p.run_for_completions(3, Duration::from_secs(1));
    let v = frames.borrow().clone();
    v
}

/// Hand `frame` to both engines, verified and unverified; returns how many frames the
/// engines then transmitted.
fn feed_both(p: &mut Pair, frame: &[u8], t: u64) -> u64 {
    let now = Instant::ZERO + Duration::from_micros(t);
    p.a().handle_frame(now, frame);
    p.b().handle_frame(now, frame);
    p.a().handle_frame_unverified(now, frame);
    p.b().handle_frame_unverified(now, frame);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut polled = 0;
    for _ in 0..64 {
        let a = p.a().poll_transmit(now, &mut buf).is_some();
        let b = p.b().poll_transmit(now, &mut buf).is_some();
        polled += a as u64 + b as u64;
        if !a && !b {
            break;
        }
    }
    p.a().handle_timeout(now + Duration::from_secs(1));
    polled
}

const OPCODES: &[Opcode] = &[
    Opcode::RC_SEND_FIRST,
    Opcode::RC_SEND_MIDDLE,
    Opcode::RC_SEND_LAST,
    Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
    Opcode::RC_SEND_ONLY,
    Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_FIRST,
    Opcode::RC_RDMA_WRITE_MIDDLE,
    Opcode::RC_RDMA_WRITE_LAST,
    Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_ONLY,
    Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_READ_REQUEST,
    Opcode::RC_RDMA_READ_RESPONSE_FIRST,
    Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode::RC_RDMA_READ_RESPONSE_LAST,
    Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    Opcode::RC_ACKNOWLEDGE,
    Opcode::RC_ATOMIC_ACKNOWLEDGE,
    Opcode::RC_COMPARE_SWAP,
    Opcode::RC_FETCH_ADD,
    Opcode::RC_SEND_LAST_WITH_INVALIDATE,
    Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
    Opcode::UD_SEND_ONLY,
    Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
];

/// A well-formed frame (valid ICRC) towards A or B with the headers its opcode needs.
#[allow(clippy::too_many_arguments)]
fn forge(
    to_b: bool,
    qpn: u32,
    opcode: Opcode,
    psn: u32,
    ack_req: bool,
    va: u64,
    key: u32,
    len: u32,
    syndrome: u8,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let info = opcode.info()?;
    let frame = FrameRepr {
        eth: EthRepr {
            dst: if to_b { MAC_B } else { MAC_A },
            src: if to_b { MAC_A } else { MAC_B },
            vlan: None,
        },
        ip: IpRepr::V4 {
            src: if to_b { IP_A } else { IP_B },
            dst: if to_b { IP_B } else { IP_A },
            tos: 0,
            ttl: 64,
            ident: 0,
            dont_fragment: true,
        },
        udp_src_port: 0xC001,
        roce: PacketRepr {
            bth: BthRepr {
                opcode,
                solicited: false,
                migreq: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: qpn,
                ack_req,
                psn: Psn::new(psn),
            },
            reth: info.has_reth.then_some(RethRepr {
                va,
                rkey: key,
                dma_len: len,
            }),
            aeth: info.has_aeth.then_some(AethRepr {
                syndrome: Syndrome::from_byte(syndrome),
                msn: psn,
            }),
            atomic_eth: info.has_atomic_eth.then_some(AtomicEthRepr {
                va,
                rkey: key,
                swap_add: 1,
                compare: 2,
            }),
            atomic_ack_eth: info
                .has_atomic_ack_eth
                .then_some(AtomicAckEthRepr { orig_data: va }),
            immdt: info.has_immdt.then_some(7),
            ieth: info.has_ieth.then_some(key),
            deth: info.has_deth.then_some(DethRepr {
                qkey: key,
                src_qp: 3,
            }),
            payload: if info.has_payload { payload } else { &[] },
        },
    };
    let mut buf = vec![0; frame.buffer_len()];
    let n = frame.emit(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Headers the parser refuses by name (QinQ and 802.1ad tags, IPv6 extension headers): the
/// engine counts them apart from malformed frames, as the XDP program leaves them to the kernel.
fn left_to_the_kernel(e: &WireError) -> bool {
    matches!(
        e,
        WireError::StackedVlan { .. }
            | WireError::ServiceVlanTag { .. }
            | WireError::Ipv6ExtensionHeaders { .. }
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Random bytes never panic, and each one handed to an engine is a counted drop of the
    /// kind the wire parser predicts: unparsable is `malformed`, a bad ICRC is `bad_icrc`
    /// (verified path), and a frame that parses is still accounted for (received or dropped
    /// for a named reason).
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let mut p = Pair::new(PairOptions::default());
        let now = Instant::ZERO + Duration::from_micros(1);
        let b0 = p.b().counters().clone();
        p.b().handle_frame(now, &bytes);
        let b1 = p.b().counters().clone();
        match parse_frame_verified(&bytes) {
            Err(WireError::BadIcrc { .. }) => prop_assert_eq!(b1.drops.bad_icrc, b0.drops.bad_icrc + 1),
            Err(e) if left_to_the_kernel(&e) => prop_assert_eq!(
                b1.drops.unsupported_headers,
                b0.drops.unsupported_headers + 1
            ),
            Err(_) => prop_assert_eq!(b1.drops.malformed, b0.drops.malformed + 1),
            Ok(_) => prop_assert!(receive_trace(&b1) > receive_trace(&b0)),
        }
        p.b().handle_frame_unverified(now, &bytes);
        let b2 = p.b().counters().clone();
        match parse_frame(&bytes) {
            Err(e) if left_to_the_kernel(&e) => prop_assert_eq!(
                b2.drops.unsupported_headers,
                b1.drops.unsupported_headers + 1
            ),
            Err(_) => prop_assert_eq!(b2.drops.malformed, b1.drops.malformed + 1),
            Ok(_) => prop_assert!(receive_trace(&b2) > receive_trace(&b1)),
        }
        feed_both(&mut p, &bytes, 1);
    }

    #[test]
    fn mutated_real_frames_never_panic(
        idx in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let frames = sample_frames();
        let mut f = frames[idx.index(frames.len())].clone();
        for (i, x) in &flips {
            let n = f.len();
            f[i.index(n)] ^= x;
        }
        if truncate {
            let n = f.len();
            f.truncate(cut.index(n));
        }
        let mut p = Pair::new(PairOptions::default());
        feed_both(&mut p, &f, 1);
    }

    /// Valid-ICRC packets with random fields reach the transport logic itself.
    #[test]
    fn forged_packets_are_handled_without_panic(
        pkts in proptest::collection::vec(
            (any::<bool>(), 0usize..OPCODES.len(), 0u32..400, any::<bool>(), any::<u64>(),
             any::<u32>(), 0u32..9000, any::<u8>(), 0usize..1100, any::<bool>(), any::<bool>()),
            1..24),
    ) {
        let mut p = Pair::new(PairOptions { psn_a: 100, psn_b: 200, ..PairOptions::default() });
        p.post_recv_b(1, 0, 4096);
        let s = p.sge_a(0, 64);
        let (bva, brkey) = (p.mr_b.addr, p.mr_b.rkey);
        p.post_a(1, WrOp::Write { remote_addr: bva, rkey: brkey }, vec![s]);
        let mut buf = vec![0; MAX_FRAME_LEN];
        let _ = p.a().poll_transmit(Instant::ZERO, &mut buf);
        let payload = vec![0x5Au8; 1100];
        for (k, (to_b, op, psn_off, ack, va, key, len, syn, plen, real_key, real_va)) in pkts.into_iter().enumerate() {
            let (qpn, base_psn) = if to_b { (p.qb, 100) } else { (p.qa, 200) };
            let psn = (base_psn + psn_off).wrapping_sub(40);
            let key = if real_key { if to_b { p.mr_b.rkey } else { p.mr_a.rkey } } else { key };
            let va = if real_va { (if to_b { p.mr_b.addr } else { p.mr_a.addr }) + (va % 4096) } else { va };
            if let Some(f) = forge(to_b, qpn, OPCODES[op], psn, ack, va, key, len, syn, &payload[..plen]) {
                // Each of the four deliveries in feed_both is received or a counted drop.
                let before = receive_trace(p.a().counters()) + receive_trace(p.b().counters());
                let sent_before = p.a().counters().sent_pkts + p.b().counters().sent_pkts;
                let polled = feed_both(&mut p, &f, k as u64);
                let after = receive_trace(p.a().counters()) + receive_trace(p.b().counters());
                prop_assert!(after >= before + 4, "{} deliveries, {} counted", 4, after - before);
                let sent = p.a().counters().sent_pkts + p.b().counters().sent_pkts;
                prop_assert_eq!(sent - sent_before, polled, "sent_pkts counts every frame polled");
            }
        }
        // The engines still answer queries and still serve fresh QPs.
        let (qa, qb) = (p.qa, p.qb);
        prop_assert!(p.a().query_qp(qa).is_ok());
        prop_assert!(p.b().query_qp(qb).is_ok());
        if let Err(e) = still_serves(&mut p) {
            prop_assert!(false, "{}", e);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Sequences of frames against connected QPs: forged requests and responses built from
    /// boundary values (VAs 0, 1, u64::MAX and near the MR's ends, lengths near the MTU, 2^31
    /// and u32::MAX, PSNs at the 2^24 wrap, R_Keys right and wrong), replays of real frames
    /// (duplicates, retries) and of real frames with other addresses or lengths at the same
    /// PSN, real WRs and timer runs. No panic (overflow checks are on in tests); every frame
    /// is accounted for; no WR completes twice; fresh QPs still work afterwards.
    #[test]
    fn frame_sequences_with_boundary_values(
        steps in proptest::collection::vec(any::<[u8; hostile::STEP_LEN]>(), 1..48),
    ) {
        let input: Vec<u8> = steps.concat();
        if let Err(e) = hostile::run(&input) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// The exact sequence of issue 10 item 5 through the sequence driver: a zero-length READ at
/// B's expected PSN with VA u64::MAX, then the same PSN again with a non-zero length.
#[test]
fn sequence_driver_covers_the_zero_length_read_duplicate() {
    // Step 0: forge to B (byte0 = 0), opcode index 12 (READ request), PSN = expected (0),
    // VA u64::MAX (table index 2), length 0 (index 0), right key (0).
    // Step 1: same, PSN one before the expected one (6), length 1 (index 2).
    let input = [[0u8, 12, 0, 2, 0, 0, 0, 1], [0u8, 12, 6, 2, 2, 0, 0, 1]].concat();
    let out = hostile::run(&input).expect("run");
    assert_eq!(out.frames_fed, 2);
    // Step kind 3 does both at once: READ (0), length 0 (0), VA u64::MAX (2), then the
    // duplicate with length 8 (table index 4).
    let out = hostile::run(&[3u8, 0, 0, 2, 0, 0, 0, 4]).expect("run");
    assert_eq!(out.frames_fed, 2);
}
