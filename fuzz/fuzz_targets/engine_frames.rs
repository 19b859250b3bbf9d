//! Fuzzes the transport engine: arbitrary frames fed to two engines with connected RC QPs
//! (an outstanding WRITE, posted receives). The first byte picks the mode:
//! - raw: the rest is split into frames (2-byte length prefix) fed as received bytes;
//! - forged: the rest is parsed as a RoCE packet (BTH onwards), aimed at a live QP and
//!   emitted with a valid ICRC, so the fuzzer reaches the transport logic behind the ICRC.
//! No input may panic; the engines must keep answering.
#![no_main]

#[path = "../../tests/common/pair.rs"]
mod pair;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use pair::{Pair, PairOptions};
use xroce::engine::{WrOp, MAX_FRAME_LEN};
use xroce::sim::workload::{IP_A, IP_B, MAC_A, MAC_B};
use xroce::wire::{EthRepr, FrameRepr, IpRepr, PacketRepr};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut p = Pair::new(PairOptions { mr_len: 1 << 16, ..PairOptions::default() });
    p.post_recv_b(1, 0, 4096);
    let s = p.sge_a(0, 2000);
    let (va, rkey) = (p.mr_b.addr, p.mr_b.rkey);
    p.post_a(1, WrOp::Write { remote_addr: va, rkey }, vec![s]);
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    while p.a().poll_transmit(Duration::ZERO, &mut buf).is_some() {}
    let mut frames: Vec<Vec<u8>> = Vec::new();
    if mode & 1 == 0 {
        let mut r = rest;
        while r.len() >= 2 {
            let n = (u16::from_le_bytes([r[0], r[1]]) as usize).min(r.len() - 2);
            frames.push(r[2..2 + n].to_vec());
            r = &r[2 + n..];
        }
    } else if let Ok(mut pkt) = PacketRepr::parse(rest) {
        let to_b = mode & 2 == 0;
        pkt.bth.dest_qp = if to_b { p.qb } else { p.qa };
        let frame = FrameRepr {
            eth: EthRepr { dst: if to_b { MAC_B } else { MAC_A }, src: if to_b { MAC_A } else { MAC_B }, vlan: None },
            ip: IpRepr::V4 {
                src: if to_b { IP_A } else { IP_B },
                dst: if to_b { IP_B } else { IP_A },
                tos: 0,
                ttl: 64,
                ident: 0,
                dont_fragment: true,
            },
            udp_src_port: 0xC000,
            roce: pkt,
        };
        let mut out = vec![0u8; frame.buffer_len()];
        if let Ok(n) = frame.emit(&mut out) {
            out.truncate(n);
            frames.push(out);
        }
    }
    for (i, f) in frames.iter().enumerate() {
        let now = Duration::from_micros(i as u64);
        p.a().handle_frame(now, f);
        p.b().handle_frame(now, f);
        if mode & 4 != 0 {
            p.b().handle_frame_unverified(now, f);
        }
        for _ in 0..256 {
            let a = p.a().poll_transmit(now, &mut buf).is_some();
            let b = p.b().poll_transmit(now, &mut buf).is_some();
            if !a && !b {
                break;
            }
        }
        p.a().handle_timeout(now + Duration::from_secs(1));
    }
    let (qa, qb) = (p.qa, p.qb);
    assert!(p.a().query_qp(qa).is_ok() && p.b().query_qp(qb).is_ok());
});
