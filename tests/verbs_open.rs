//! `Device::open`: what it reports about the interface, and its typed errors.
use std::net::{IpAddr, Ipv4Addr};

use xroce::verbs::*;

#[test]
fn missing_interface_is_named() {
    let err = Device::open("xroce-nope0", DeviceConfig::default()).unwrap_err();
    assert!(
        err.to_string().contains("\"xroce-nope0\" not found"),
        "{err}"
    );
    let err = Device::open(
        "bad/name",
        DeviceConfig {
            driver: DriverKind::Udp,
            ..DeviceConfig::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("invalid interface name"), "{err}");
}

#[test]
fn udp_device_on_loopback_reports_port_and_gids() {
    let ip = IpAddr::V4(xroce::driver::udp::unique_loopback_v4(9));
    let dev = Device::open(
        "lo",
        DeviceConfig {
            driver: DriverKind::Udp,
            udp_local_ip: Some(ip),
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    assert_eq!(dev.name(), "xroce_lo");
    assert_eq!(dev.driver_info().mode.as_str(), "udp");
    // Index 0 link-local (derived), index 1 the bound IPv4 address, nothing else: the socket
    // only receives what is sent to that address.
    assert_eq!(dev.gid_table().len(), 2);
    assert_eq!(dev.ipv4_gid_index(), Some(1));
    assert_eq!(dev.query_gid(1).unwrap(), Gid::from_ip(ip));
    assert_eq!(dev.gid_index_of(ip), Some(1));
    assert_eq!(
        dev.gid_index_of(IpAddr::V4(Ipv4Addr::new(198, 18, 9, 9))),
        None
    );
    let port = dev.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!(
        port.active_mtu,
        Mtu::Mtu4096,
        "lo's 65536-byte MTU allows 4096"
    );
    let attr = dev.query_device();
    assert_eq!(attr.phys_port_cnt, 1);
    assert!(attr.max_qp_wr >= 1024);
    // The link-local GID 0 is listed (rxe's layout) but the socket cannot send from it: an
    // address vector using it is refused up front, not left to end in RETRY_EXC_ERR.
    let err = dev
        .resolve_av(&AhAttr::new(Gid::from_ip(ip), 0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sends only from its bound address") && err.contains("use GID index 1"),
        "{err}"
    );
    // A second device on the same address and port is refused by the kernel, clearly.
    let err = Device::open(
        "lo",
        DeviceConfig {
            driver: DriverKind::Udp,
            udp_local_ip: Some(ip),
            ..DeviceConfig::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("4791") || err.to_string().to_lowercase().contains("in use"),
        "{err}"
    );
}

#[test]
fn an_mr_keeps_its_device_working_after_the_device_handle_is_dropped() {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let pd = a.alloc_pd().unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    mr.write(0, b"still here").unwrap();
    drop(a);
    drop(pd);
    // The MR holds its PD and device: no use-after-free, the bytes are still there.
    assert_eq!(mr.to_vec(0, 10).unwrap(), b"still here");
    mr.write(0, b"and usable").unwrap();
    assert_eq!(mr.to_vec(0, 10).unwrap(), b"and usable");
    drop(mr);
    drop(b);
}
