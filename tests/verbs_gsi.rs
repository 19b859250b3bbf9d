//! The GSI (QP1) through the verbs API over the in-memory driver: MADs both ways with their
//! sender's address, one GSI per device, the sharded case (QP1 on shard `1 % count`).
use std::time::Duration;

use xroce::engine::{EngineError, GSI_QKEY};
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(10);

fn mad(tag: u8) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    for (i, b) in m.iter_mut().enumerate() {
        *b = tag.wrapping_add(i as u8);
    }
    m
}

/// Both devices' GSIs, and the address of B's from A.
fn open_both(a: &Device, b: &Device) -> (Gsi, Gsi, MadAddress) {
    let ga = a.ipv4_gid_index().unwrap();
    let gb = b.ipv4_gid_index().unwrap();
    let to_b = MadAddress::gsi(b.query_gid(gb).unwrap(), ga as u8);
    (a.open_gsi().unwrap(), b.open_gsi().unwrap(), to_b)
}

fn exchange(a: &Device, b: &Device) {
    let (gsi_a, gsi_b, to_b) = open_both(a, b);
    let ga = a.ipv4_gid_index().unwrap();
    let gb = b.ipv4_gid_index().unwrap();
    gsi_a.send(&to_b, &mad(7)).unwrap();
    let got = gsi_b.recv_timeout(WAIT).unwrap();
    assert_eq!(*got.mad, mad(7));
    assert_eq!(got.src_qpn, 1);
    assert_eq!(got.src_gid, a.query_gid(ga).unwrap());
    assert_eq!(got.src_mac, a.netdev().mac);
    assert_eq!(got.dest_gid, b.query_gid(gb).unwrap());
    assert_eq!(got.dest_gid_index, Some(gb));
    assert_eq!(got.hop_limit, 64);
    // The answer goes back through what the request says, with no neighbour lookup.
    let back = got.reply_to();
    assert_eq!(
        (back.qpn, back.qkey, back.sgid_index),
        (1, GSI_QKEY, gb as u8)
    );
    gsi_b.send(&back, &mad(9)).unwrap();
    let answer = gsi_a.recv_timeout(WAIT).unwrap_or_else(|e| {
        panic!(
            "{e}: a {:?}\nb {:?}\n{:?} {:?}",
            a.counters(),
            b.counters(),
            gsi_b.stats(),
            b.last_emit_error()
        )
    });
    assert_eq!(*answer.mad, mad(9));
    assert_eq!(answer.src_gid, b.query_gid(gb).unwrap());
    // Many, more than the receive ring holds at once, in order.
    for i in 0..200u32 {
        gsi_a.send(&to_b, &mad(i as u8)).unwrap();
        let got = gsi_b.recv_timeout(WAIT).unwrap_or_else(|e| {
            panic!(
                "MAD {i}: {e}: a {:?}\nb {:?}\n{:?}",
                a.counters(),
                b.counters(),
                gsi_b.stats()
            )
        });
        assert_eq!(*got.mad, mad(i as u8), "MAD {i}");
    }
    assert_eq!(gsi_b.stats().received, 201);
    assert_eq!(gsi_b.stats().bad_receives, 0);
    assert_eq!(a.counters().gsi_sent, 201);
    assert_eq!(b.counters().gsi_rcvd, 201);
    assert!(gsi_a.poll_recv().unwrap().is_none());
}

#[test]
fn two_devices_exchange_mads_on_qp1() {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    exchange(&a, &b);
}

#[test]
fn sharded_devices_keep_qp1_on_its_shard() {
    let cfg = DeviceConfig {
        shards: 2,
        ..DeviceConfig::default()
    };
    let (a, b, _links) = Device::mem_pair_sharded(&mem_link_config(1500, 0.0, 1), cfg).unwrap();
    exchange(&a, &b);
}

#[test]
fn one_gsi_per_device() {
    let (a, _b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let gsi = a.open_gsi().unwrap();
    match a.open_gsi() {
        Err(VerbsError::Engine(EngineError::GsiExists)) => {}
        other => panic!("a second GSI: {other:?}"),
    }
    drop(gsi);
    // Closed, it opens again.
    let _gsi = a.open_gsi().unwrap();
}

#[test]
fn a_bad_mad_address_is_a_typed_error() {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let gsi = a.open_gsi().unwrap();
    let gb = b.ipv4_gid_index().unwrap();
    let mut to = MadAddress::gsi(b.query_gid(gb).unwrap(), a.ipv4_gid_index().unwrap() as u8);
    to.pkey_index = 1;
    assert!(matches!(
        gsi.send(&to, &mad(0)),
        Err(VerbsError::InvalidArgument(_))
    ));
    to.pkey_index = 0;
    to.sgid_index = 200;
    assert!(matches!(
        gsi.send(&to, &mad(0)),
        Err(VerbsError::NoSuchGid { .. })
    ));
    // Nothing came: a timeout, typed.
    assert!(matches!(
        gsi.recv_timeout(Duration::from_millis(50)),
        Err(VerbsError::Timeout(_))
    ));
}

#[test]
fn a_route_in_memory_comes_from_the_static_neighbours() {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let gb = b.ipv4_gid_index().unwrap();
    let b_ip = b.query_gid(gb).unwrap().to_ip();
    let route = a.resolve_route(b_ip).unwrap();
    assert_eq!(route.mac, b.netdev().mac);
    assert_eq!(route.sgid_index, a.ipv4_gid_index().unwrap());
    assert_eq!(route.source, a.query_gid(route.sgid_index).unwrap().to_ip());
    assert_eq!(route.gateway, None);
    // An address nobody declared: a typed error, not a wait.
    let nobody: std::net::IpAddr = "198.18.0.99".parse().unwrap();
    assert!(matches!(
        a.resolve_route(nobody),
        Err(VerbsError::Netdev(_))
    ));
}

/// The CM's MADs never wait for a batch: however many are sent back to back (a burst of
/// posts on any other QP leaves in batches after its first `BURST_POSTS_SENT_AT_ONCE`),
/// each send transmits in its own call.
#[test]
fn each_mad_of_a_burst_leaves_in_its_own_call() {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let (gsi_a, gsi_b, to_b) = open_both(&a, &b);
    let stats = a.progress_stats();
    let count = 2 * BURST_POSTS_SENT_AT_ONCE as u32;
    for i in 0..count {
        gsi_a.send(&to_b, &mad(i as u8)).unwrap();
        assert_eq!(
            stats
                .batched_posts
                .load(std::sync::atomic::Ordering::Relaxed),
            0,
            "MAD {i} of a burst waited for a batch"
        );
    }
    for i in 0..count {
        assert_eq!(*gsi_b.recv_timeout(WAIT).unwrap().mad, mad(i as u8));
    }
}
