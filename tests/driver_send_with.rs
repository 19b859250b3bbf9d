//! `Driver::send_with`: a frame written straight into the driver's transmit buffer, over the
//! in-memory driver (the default implementation), through `PcapTap` (which must record it)
//! and behind a `Box<dyn Driver>`. The AF_XDP implementation is tested on a veth pair in
//! `tests/driver_xdp.rs`.
#[path = "common/pair.rs"]
mod pair;

use xroce::capture::read_capture;
use xroce::driver::mem::{MemDriver, MemLinkConfig};
use xroce::driver::tap::PcapTap;
use xroce::driver::{Driver, DriverError};
use xroce::engine::{transmit_buffer_len, Instant, Mtu, WcStatus, WrOp, MAX_FRAME_LEN};

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn frame(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

fn received(d: &mut impl Driver) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    d.recv(1024, &mut |f, _| got.push(f.to_vec())).unwrap();
    got
}

/// Send `frames` with `send_with`, each after a call whose writer has nothing to send.
fn send_all(d: &mut dyn Driver, frames: &[Vec<u8>]) {
    for f in frames {
        let nothing = d.send_with(2048, &mut |_| None).unwrap();
        assert_eq!(nothing, None, "a writer with nothing to send sends nothing");
        let sent = d
            .send_with(2048, &mut |buf| {
                assert_eq!(buf.len(), 2048, "the writer gets max_len bytes");
                buf[..f.len()].copy_from_slice(f);
                Some(f.len())
            })
            .unwrap();
        assert_eq!(sent, Some(f.len()));
    }
    d.flush().unwrap();
}

#[test]
fn frames_written_in_place_arrive_byte_for_byte_in_order() {
    let (mut a, mut b, _link) = MemDriver::pair(MAC_A, MAC_B, &MemLinkConfig::default()).unwrap();
    let frames: Vec<Vec<u8>> = (0..50u8).map(|i| frame(i, 60 + i as usize * 29)).collect();
    send_all(&mut a, &frames);
    assert_eq!(received(&mut b), frames);
    assert!(received(&mut b).is_empty(), "the empty writes sent nothing");
}

#[test]
fn a_writer_claiming_more_than_its_buffer_is_refused() {
    let (mut a, mut b, _link) = MemDriver::pair(MAC_A, MAC_B, &MemLinkConfig::default()).unwrap();
    let err = a.send_with(100, &mut |_| Some(101)).unwrap_err();
    assert!(matches!(err, DriverError::InvalidFrame { .. }), "{err:?}");
    a.flush().unwrap();
    assert!(received(&mut b).is_empty());
    // The driver still works afterwards.
    send_all(&mut a, &[frame(9, 64)]);
    assert_eq!(received(&mut b), vec![frame(9, 64)]);
}

#[test]
fn a_frame_larger_than_the_driver_takes_is_refused_like_send() {
    let (mut a, _b, _link) = MemDriver::pair(MAC_A, MAC_B, &MemLinkConfig::default()).unwrap();
    let max = a.info().max_frame;
    let err = a.send_with(max + 100, &mut |_| Some(max + 1)).unwrap_err();
    assert!(matches!(err, DriverError::FrameTooLarge { .. }), "{err:?}");
}

#[test]
fn through_a_box_and_a_pcap_tap_every_frame_is_sent_and_recorded() {
    let (a, mut b, _link) = MemDriver::pair(MAC_A, MAC_B, &MemLinkConfig::default()).unwrap();
    let path = std::env::temp_dir().join(xroce::netns::unique_name("xroce-send-with-"));
    let tap = PcapTap::create(a, &path).unwrap();
    let mut boxed: Box<dyn Driver> = Box::new(tap);
    assert_eq!(
        boxed.send_with_room(),
        usize::MAX,
        "no limit through scratch"
    );
    let frames: Vec<Vec<u8>> = (0..10u8).map(|i| frame(i, 64 + i as usize)).collect();
    send_all(&mut boxed, &frames);
    assert_eq!(received(&mut b), frames);
    drop(boxed); // writes the capture out
    let recorded: Vec<Vec<u8>> = read_capture(&path)
        .unwrap()
        .into_iter()
        .map(|f| f.data)
        .collect();
    let _ = std::fs::remove_file(&path);
    assert_eq!(
        recorded, frames,
        "the tap records what was written, once each"
    );
}

#[test]
fn engines_emit_straight_into_the_drivers_buffers_and_messages_complete() {
    let mut p = pair::Pair::new(pair::PairOptions::default());
    let (mut da, mut db, _link) = MemDriver::pair(MAC_A, MAC_B, &MemLinkConfig::default()).unwrap();
    let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
    p.a().mr_write(lkey, addr, b"sent in place").unwrap();
    for i in 0..20u64 {
        p.post_recv_b(i, i * 64, 64);
    }
    for i in 0..20u64 {
        p.post_a(i, WrOp::Send, vec![p.sge_a(0, 13)]);
    }
    let now = Instant::ZERO;
    // The pair's path MTU is 1024: a buffer of exactly what it needs is enough.
    let len = transmit_buffer_len(Mtu::Mtu1024);
    assert!(len < MAX_FRAME_LEN);
    for _ in 0..10 {
        for (e, d) in [(0, &mut da), (1, &mut db)] {
            let engine = &mut p.net.engines[e];
            while d
                .send_with(len, &mut |buf| engine.poll_transmit(now, buf))
                .unwrap()
                .is_some()
            {}
            d.flush().unwrap();
        }
        for (e, d) in [(0, &mut da), (1, &mut db)] {
            let engine = &mut p.net.engines[e];
            d.recv(1024, &mut |f, _| engine.handle_frame(now, f))
                .unwrap();
        }
    }
    let (cq_a, cq_b) = (p.cq_a, p.cq_b);
    let wcs = pair::drain(p.a(), cq_a);
    assert_eq!(wcs.len(), 20);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let got = pair::drain(p.b(), cq_b);
    assert_eq!(got.len(), 20);
    let mut bytes = [0u8; 13];
    let (lkey, addr) = (p.mr_b.lkey, p.mr_b.addr);
    p.b().mr_read(lkey, addr + 19 * 64, &mut bytes).unwrap();
    assert_eq!(&bytes, b"sent in place");
}

#[test]
fn transmit_buffer_len_is_what_poll_transmit_needs_at_each_mtu() {
    assert_eq!(transmit_buffer_len(Mtu::Mtu4096), MAX_FRAME_LEN);
    // One byte less and the engine refuses the buffer (counted), sending nothing.
    let mut p = pair::Pair::new(pair::PairOptions::default());
    p.post_a(1, WrOp::Send, vec![p.sge_a(0, 8)]);
    let mut small = vec![0u8; transmit_buffer_len(Mtu::Mtu1024) - 1];
    assert_eq!(p.a().poll_transmit(Instant::ZERO, &mut small), None);
    assert_eq!(p.a().counters().drops.tx_buffer_too_small, 1);
    let mut exact = vec![0u8; transmit_buffer_len(Mtu::Mtu1024)];
    assert!(p.a().poll_transmit(Instant::ZERO, &mut exact).is_some());
}
