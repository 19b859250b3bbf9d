//! Each header's pretty-printer (`wire::PrettyPrint`) on a real frame: rxe captures from
//! tests/fixtures where they hold the header, else a frame `FrameRepr::emit` wrote (the
//! fixtures have no atomics, immediate data or invalidate).
use std::net::Ipv4Addr;
use std::path::PathBuf;

use xroce::capture::read_capture;
use xroce::wire::{
    parse_frame, AtomicAckEthRepr, AtomicEthRepr, EthRepr, FrameRepr, IcrcCheck, IethRepr,
    ImmDtRepr, IpRepr, Opcode, PacketRepr, PrettyPrint, Psn,
};

fn fixture_frame(file: &str, opcode: Opcode) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    read_capture(path)
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .find(|d| parse_frame(d).is_ok_and(|p| p.repr.roce.bth.opcode == opcode))
        .unwrap_or_else(|| panic!("{file} has no {opcode}"))
}

/// A frame emitted for `roce`, between 198.18.0.1 and 198.18.0.2.
fn emitted(roce: PacketRepr<'_>) -> Vec<u8> {
    let repr = FrameRepr {
        eth: EthRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
        },
        ip: IpRepr::V4 {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            tos: 0,
            ttl: 64,
            ident: 1,
            dont_fragment: true,
        },
        udp_src_port: 0xc000,
        roce,
    };
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

fn check(actual: String, expected: &str) {
    if actual != expected {
        panic!("pretty-printed:\n{actual}\nexpected:\n{expected}");
    }
}

/// (name, explanation) of each header on its frame.
fn cases() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let send = fixture_frame("rxe_rc_pingpong.pcap", Opcode::RC_SEND_LAST);
    let p = parse_frame(&send).unwrap();
    out.push(("ethernet", p.repr.eth.explain(&send, 0, 1)));
    out.push(("ipv4", p.repr.ip.explain(&send, p.offsets.ip, 1)));
    let udp = etherparse::UdpHeaderSlice::from_slice(&send[p.offsets.udp..])
        .unwrap()
        .to_header();
    out.push(("udp", udp.explain(&send, p.offsets.udp, 1)));
    out.push(("bth", p.repr.roce.bth.explain(&send, p.offsets.bth, 1)));

    let ack = fixture_frame("rxe_rc_pingpong.pcap", Opcode::RC_ACKNOWLEDGE);
    let p = parse_frame(&ack).unwrap();
    let after_bth = p.offsets.bth + 12;
    out.push((
        "aeth",
        p.repr.roce.aeth.unwrap().explain(&ack, after_bth, 1),
    ));
    let icrc = IcrcCheck {
        received: p.icrc_received,
        computed: p.icrc_computed,
    };
    out.push(("icrc", icrc.explain(&ack, p.offsets.icrc, 1)));
    let damaged = IcrcCheck {
        received: p.icrc_received,
        computed: p.icrc_computed ^ 1,
    };
    out.push(("icrc_damaged", damaged.explain(&ack, p.offsets.icrc, 1)));
    out.push(("whole_ack", p.explain(&ack, 0, 1)));

    let write = fixture_frame("rxe_write_bw.pcap", Opcode::RC_RDMA_WRITE_FIRST);
    let p = parse_frame(&write).unwrap();
    out.push((
        "reth",
        p.repr.roce.reth.unwrap().explain(&write, after_bth, 1),
    ));

    let ud = fixture_frame("rxe_ud_pingpong.pcap", Opcode::UD_SEND_ONLY);
    let p = parse_frame(&ud).unwrap();
    out.push(("deth", p.repr.roce.deth.unwrap().explain(&ud, after_bth, 1)));

    let mut cas = PacketRepr::new(Opcode::RC_COMPARE_SWAP, 0x12);
    cas.bth.psn = Psn::new(7);
    cas.atomic_eth = Some(AtomicEthRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x135,
        swap_add: 2,
        compare: 1,
    });
    let f = emitted(cas);
    out.push((
        "atomic_eth",
        cas.atomic_eth.unwrap().explain(&f, after_bth, 1),
    ));
    let mut atomic_ack = PacketRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0x11);
    atomic_ack.aeth = parse_frame(&ack).unwrap().repr.roce.aeth;
    atomic_ack.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: 1 });
    let f = emitted(atomic_ack);
    let at = after_bth + 4;
    out.push((
        "atomic_ack_eth",
        atomic_ack.atomic_ack_eth.unwrap().explain(&f, at, 1),
    ));
    let mut imm = PacketRepr::new(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 0x12);
    imm.immdt = Some(0xdead_beef);
    imm.payload = b"hello";
    let f = emitted(imm);
    out.push(("immdt", ImmDtRepr(0xdead_beef).explain(&f, after_bth, 1)));
    out.push((
        "packet_with_pad",
        parse_frame(&f)
            .unwrap()
            .repr
            .roce
            .explain(&f, p.offsets.bth, 1),
    ));
    let mut inv = PacketRepr::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 0x12);
    inv.ieth = Some(0x435);
    let f = emitted(inv);
    out.push(("ieth", IethRepr(0x435).explain(&f, after_bth, 1)));
    out
}

fn explanation(name: &str) -> String {
    cases()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| text)
        .unwrap()
}

#[test]
fn explains_ethernet() {
    check(
        explanation("ethernet"),
        r#"  Ethernet [0..14]
    0000  52 54 00 00 00 11        destination MAC 52:54:00:00:00:11
    0006  52 54 00 00 00 12        source MAC 52:54:00:00:00:12
    000c  08 00                    EtherType = IPv4
"#,
    );
}

#[test]
fn explains_ipv4() {
    check(
        explanation("ipv4"),
        r#"  IPv4 [14..34]  (the ICRC covers it, but sees the variant fields as 0xFF)
    000e  45                       version 4, IHL 5 (20-byte header, no options)   [ICRC: covered]
    000f  00                       TOS: DSCP 0, ECN 0 (routers may rewrite it)   [ICRC: masked]
    0010  04 2c                    total length 1068   [ICRC: covered]
    0012  4b 1f                    identification 0x4b1f   [ICRC: covered]
    0014  40 00                    flags: DF set (RoCE is never fragmented), fragment offset 0   [ICRC: covered]
    0016  40                       TTL 64 (decremented per hop)   [ICRC: masked]
    0017  11                       protocol 17 = UDP   [ICRC: covered]
    0018  5f 66                    header checksum 0x5f66 (ok; recomputed per hop)   [ICRC: masked]
    001a  c6 12 00 0c              source 198.18.0.12   [ICRC: covered]
    001e  c6 12 00 0b              destination 198.18.0.11   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_udp() {
    check(
        explanation("udp"),
        r#"  UDP [34..42]
    0022  c1 21                    source port 49441 (any value; rxe hashes the QP numbers into it for ECMP)   [ICRC: covered]
    0024  12 b7                    destination port 4791 = RoCEv2   [ICRC: covered]
    0026  04 18                    length 1048 (UDP header + RoCE packet + ICRC)   [ICRC: covered]
    0028  00 00                    checksum 0 = not used (the ICRC protects the packet)   [ICRC: masked]
"#,
    );
}

#[test]
fn explains_bth() {
    check(
        explanation("bth"),
        r#"  BTH [42..54]  Base Transport Header
    002a  02                       opcode 0x02 RC_SEND_LAST: last packet of a multi-packet SEND; completes the receive WQE   [ICRC: covered]
    002b  00                       SE 0 (solicited event), M 0 (MigReq), PadCnt 0 (pad bytes before the ICRC), TVer 0   [ICRC: covered]
    002c  ff ff                    P_Key 0xffff (default partition, full member)   [ICRC: covered]
    002e  00                       FECN 0, BECN 0, reserved (congestion marks; switches may set them)   [ICRC: masked]
    002f  00 00 11                 destination QP 0x11   [ICRC: covered]
    0032  80                       AckReq 1: the responder must acknowledge this packet; the last packet of a message: the requester needs the ACK to complete the work request   [ICRC: covered]
    0033  2f a5 27                 PSN 3122471 (24-bit packet sequence number)   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_aeth() {
    check(
        explanation("aeth"),
        r#"  AETH [54..58]  ACK ETH
    0036  1f                       syndrome 0x1f: ACK; credit code 31 = the responder does not limit by receive credits (what rxe sends)   [ICRC: covered]
    0037  00 00 01                 MSN 1: messages the responder has completed (mod 2^24)   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_icrc() {
    check(
        explanation("icrc"),
        r#"  ICRC [58..62]
    003a  0d 78 6f f0              ICRC 0xf06f780d, sent least significant byte first; matches. Computed as CRC-32 over 8 x 0xFF, then IP header .. pad with the [masked] bytes set to 0xFF
"#,
    );
}

#[test]
fn explains_icrc_damaged() {
    check(
        explanation("icrc_damaged"),
        r#"  ICRC [58..62]
    003a  0d 78 6f f0              ICRC 0xf06f780d, sent least significant byte first; DOES NOT MATCH the computed 0xf06f780c: the packet was damaged. Computed as CRC-32 over 8 x 0xFF, then IP header .. pad with the [masked] bytes set to 0xFF
"#,
    );
}

#[test]
fn explains_whole_ack() {
    check(
        explanation("whole_ack"),
        r#"  Ethernet [0..14]
    0000  52 54 00 00 00 12        destination MAC 52:54:00:00:00:12
    0006  52 54 00 00 00 11        source MAC 52:54:00:00:00:11
    000c  08 00                    EtherType = IPv4
  IPv4 [14..34]  (the ICRC covers it, but sees the variant fields as 0xFF)
    000e  45                       version 4, IHL 5 (20-byte header, no options)   [ICRC: covered]
    000f  00                       TOS: DSCP 0, ECN 0 (routers may rewrite it)   [ICRC: masked]
    0010  00 30                    total length 48   [ICRC: covered]
    0012  53 a5                    identification 0x53a5   [ICRC: covered]
    0014  40 00                    flags: DF set (RoCE is never fragmented), fragment offset 0   [ICRC: covered]
    0016  40                       TTL 64 (decremented per hop)   [ICRC: masked]
    0017  11                       protocol 17 = UDP   [ICRC: covered]
    0018  5a dc                    header checksum 0x5adc (ok; recomputed per hop)   [ICRC: masked]
    001a  c6 12 00 0b              source 198.18.0.11   [ICRC: covered]
    001e  c6 12 00 0c              destination 198.18.0.12   [ICRC: covered]
  UDP [34..42]
    0022  c1 21                    source port 49441 (any value; rxe hashes the QP numbers into it for ECMP)   [ICRC: covered]
    0024  12 b7                    destination port 4791 = RoCEv2   [ICRC: covered]
    0026  00 1c                    length 28 (UDP header + RoCE packet + ICRC)   [ICRC: covered]
    0028  00 00                    checksum 0 = not used (the ICRC protects the packet)   [ICRC: masked]
  BTH [42..54]  Base Transport Header
    002a  11                       opcode 0x11 RC_ACKNOWLEDGE: acknowledges every request up to its PSN (ACK), or reports an error or RNR (NAK) by its AETH syndrome   [ICRC: covered]
    002b  00                       SE 0 (solicited event), M 0 (MigReq), PadCnt 0 (pad bytes before the ICRC), TVer 0   [ICRC: covered]
    002c  ff ff                    P_Key 0xffff (default partition, full member)   [ICRC: covered]
    002e  00                       FECN 0, BECN 0, reserved (congestion marks; switches may set them)   [ICRC: masked]
    002f  00 00 11                 destination QP 0x11   [ICRC: covered]
    0032  00                       AckReq 0 (responses and CNPs are never acknowledged)   [ICRC: covered]
    0033  2f a5 27                 PSN 3122471 (24-bit packet sequence number)   [ICRC: covered]
  AETH [54..58]  ACK ETH
    0036  1f                       syndrome 0x1f: ACK; credit code 31 = the responder does not limit by receive credits (what rxe sends)   [ICRC: covered]
    0037  00 00 01                 MSN 1: messages the responder has completed (mod 2^24)   [ICRC: covered]
  payload [58..58]  0 bytes
  ICRC [58..62]
    003a  0d 78 6f f0              ICRC 0xf06f780d, sent least significant byte first; matches. Computed as CRC-32 over 8 x 0xFF, then IP header .. pad with the [masked] bytes set to 0xFF
"#,
    );
}

#[test]
fn explains_reth() {
    check(
        explanation("reth"),
        r#"  RETH [54..70]  RDMA ETH
    0036  00 00 55 a3 bc 87 60 00  virtual address 0x55a3bc876000 in the responder's memory region   [ICRC: covered]
    003e  00 00 04 35              R_Key 0x435: the key that grants access to that region   [ICRC: covered]
    0042  00 00 10 00              DMA length 4096 bytes for the whole message   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_deth() {
    check(
        explanation("deth"),
        r#"  DETH [54..62]  Datagram ETH
    0036  11 11 11 11              Q_Key 0x11111111: must match the receiving UD QP's Q_Key   [ICRC: covered]
    003a  00                       reserved   [ICRC: covered]
    003b  00 00 12                 source QP 0x12: where a reply goes   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_atomic_eth() {
    check(
        explanation("atomic_eth"),
        r#"  AtomicETH [54..82]
    0036  00 00 7f 00 00 00 10 00  virtual address 0x7f0000001000 (8-byte aligned)   [ICRC: covered]
    003e  00 00 01 35              R_Key 0x135   [ICRC: covered]
    0042  00 00 00 00 00 00 00 02  swap/add data 0x2   [ICRC: covered]
    004a  00 00 00 00 00 00 00 01  compare data 0x1   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_atomic_ack_eth() {
    check(
        explanation("atomic_ack_eth"),
        r#"  AtomicAckETH [58..66]
    003a  00 00 00 00 00 00 00 01  original remote data 0x1   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_immdt() {
    check(
        explanation("immdt"),
        r#"  ImmDt [54..58]
    0036  de ad be ef              immediate data 0xdeadbeef: delivered in the receiver's completion   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_packet_with_pad() {
    check(
        explanation("packet_with_pad"),
        r#"  BTH [42..54]  Base Transport Header
    002a  05                       opcode 0x05 RC_SEND_ONLY_WITH_IMMEDIATE: a whole SEND in one packet, with 32 bits of immediate data   [ICRC: covered]
    002b  30                       SE 0 (solicited event), M 0 (MigReq), PadCnt 3 (pad bytes before the ICRC), TVer 0   [ICRC: covered]
    002c  ff ff                    P_Key 0xffff (default partition, full member)   [ICRC: covered]
    002e  00                       FECN 0, BECN 0, reserved (congestion marks; switches may set them)   [ICRC: masked]
    002f  00 00 12                 destination QP 0x12   [ICRC: covered]
    0032  00                       AckReq 0: no ACK needed now; a later ACK will cover this PSN too (ACKs are cumulative)   [ICRC: covered]
    0033  00 00 00                 PSN 0 (24-bit packet sequence number)   [ICRC: covered]
  ImmDt [54..58]
    0036  de ad be ef              immediate data 0xdeadbeef: delivered in the receiver's completion   [ICRC: covered]
  payload [58..63]  5 bytes
    003a  68 65 6c 6c 6f           data   [ICRC: covered]
  pad [63..66]
    003f  00 00 00                 3 zero bytes: the packet must be whole 32-bit words   [ICRC: covered]
"#,
    );
}

#[test]
fn explains_ieth() {
    check(
        explanation("ieth"),
        r#"  IETH [54..58]
    0036  00 00 04 35              R_Key 0x00000435 the receiver must invalidate   [ICRC: covered]
"#,
    );
}
