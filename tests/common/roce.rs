//! Real RoCEv2 frames (valid ICRC) for the driver tests, built with `xroce::wire`:
//! `#[path = "common/roce.rs"] mod roce;`.
#![allow(dead_code)]

use xroce::wire::{EthRepr, FrameRepr, IpRepr, Opcode, PacketRepr};

/// An RC SEND ONLY to QP 0x11 carrying `payload`, from `eth`/`ip`/`udp_src_port`.
pub fn rc_send_only(eth: EthRepr, ip: IpRepr, udp_src_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut roce = PacketRepr::new(Opcode::RC_SEND_ONLY, 0x11);
    roce.payload = payload;
    let f = FrameRepr {
        eth,
        ip,
        udp_src_port,
        roce,
    };
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf).expect("a buffer of buffer_len() bytes");
    buf
}
