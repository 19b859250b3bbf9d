//! Facts about a network interface: index, MAC, MTU, up/down, receive queues.
//!
//! Read over rtnetlink ([`crate::netdev::query`]) rather than from `/sys/class/net`,
//! because sysfs shows the namespace it was mounted in, while a netlink socket always
//! belongs to the calling thread's network namespace. Only the receive queue count comes
//! from sysfs, as it always has (`ip netns exec` mounts the namespace's own sysfs).

use crate::netdev::{self, NetdevError};

use super::DriverError;

/// Longest interface name plus its NUL terminator (`IFNAMSIZ` of the kernel).
const IFNAMSIZ: usize = 16;

/// What the kernel says about an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// The interface name.
    pub name: String,
    /// The kernel's interface index.
    pub ifindex: u32,
    /// The hardware (MAC) address.
    pub mac: [u8; 6],
    /// The link MTU (largest IP packet).
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Operationally up, or up with an unknown operational state (IFF_RUNNING).
    pub running: bool,
    /// Number of receive queues (from sysfs when visible, else 1).
    pub rx_queues: u32,
}

/// Look up an interface by name in the calling thread's network namespace.
pub fn interface_info(name: &str) -> Result<InterfaceInfo, DriverError> {
    if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('/') {
        return Err(DriverError::Config {
            reason: format!(
                "interface name {name:?} is not valid (1..{} bytes, no '/')",
                IFNAMSIZ - 1
            ),
        });
    }
    if name.contains('\0') {
        return Err(DriverError::Config {
            reason: format!("interface name {name:?} contains a NUL byte"),
        });
    }
    let link = netdev::query(name).map_err(|e| match e {
        NetdevError::NoSuchInterface(_) => DriverError::InterfaceMissing {
            ifname: name.to_string(),
        },
        NetdevError::InvalidName(_) => DriverError::Config {
            reason: e.to_string(),
        },
        NetdevError::Netlink { source, .. } => {
            DriverError::io(format!("querying interface {name:?}"), source)
        }
        other => DriverError::io(
            format!("querying interface {name:?}"),
            std::io::Error::other(other),
        ),
    })?;

    let rx_queues = std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1);

    Ok(InterfaceInfo {
        name: name.to_string(),
        ifindex: link.ifindex,
        mac: link.mac.0,
        mtu: link.mtu,
        up: link.admin_up,
        running: link.is_active(),
        rx_queues,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_interface_is_found() {
        let lo = interface_info("lo").expect("lo exists in every namespace");
        assert_eq!(lo.name, "lo");
        assert!(lo.ifindex >= 1);
        assert_eq!(lo.mac, [0; 6]);
        assert!(lo.mtu >= 1500);
    }

    #[test]
    fn missing_interface_is_a_typed_error() {
        match interface_info("xroce-nope0") {
            Err(DriverError::InterfaceMissing { ifname }) => assert_eq!(ifname, "xroce-nope0"),
            other => panic!("expected InterfaceMissing, got {other:?}"),
        }
    }

    #[test]
    fn bad_names_are_rejected_before_any_syscall() {
        assert!(matches!(
            interface_info(""),
            Err(DriverError::Config { .. })
        ));
        assert!(matches!(
            interface_info("a-name-longer-than-sixteen"),
            Err(DriverError::Config { .. })
        ));
        assert!(matches!(
            interface_info("a\0b"),
            Err(DriverError::Config { .. })
        ));
    }
}
