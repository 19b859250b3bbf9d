//! Facts about a network interface: index, MAC, MTU, up/down, receive queues.
//!
//! Uses ioctls on a throw-away socket rather than `/sys/class/net`, because sysfs shows the
//! namespace it was mounted in, while a socket always belongs to the calling thread's
//! network namespace.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::DriverError;

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
    /// Carrier present (IFF_RUNNING).
    pub running: bool,
    /// Number of receive queues (from sysfs when visible, else 1).
    pub rx_queues: u32,
}

/// Look up an interface by name in the calling thread's network namespace.
pub fn interface_info(name: &str) -> Result<InterfaceInfo, DriverError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('/') {
        return Err(DriverError::Config {
            reason: format!(
                "interface name {name:?} is not valid (1..{} bytes, no '/')",
                libc::IFNAMSIZ - 1
            ),
        });
    }
    let cname = CString::new(name).map_err(|_| DriverError::Config {
        reason: format!("interface name {name:?} contains a NUL byte"),
    })?;
    let sock = control_socket()?;

    let mut req = new_ifreq(&cname);
    ioctl(&sock, libc::SIOCGIFINDEX, &mut req).map_err(|e| missing_or_io(name, e))?;
    // Safety: SIOCGIFINDEX succeeded, so the kernel wrote the ifindex member of the union.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex } as u32;

    let mut req = new_ifreq(&cname);
    ioctl(&sock, libc::SIOCGIFHWADDR, &mut req).map_err(|e| missing_or_io(name, e))?;
    // Safety: SIOCGIFHWADDR succeeded, so the kernel wrote the hwaddr member (a sockaddr).
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *dst = *src as u8;
    }

    let mut req = new_ifreq(&cname);
    ioctl(&sock, libc::SIOCGIFMTU, &mut req).map_err(|e| missing_or_io(name, e))?;
    // Safety: SIOCGIFMTU succeeded, so the kernel wrote the mtu member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu } as u32;

    let mut req = new_ifreq(&cname);
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut req).map_err(|e| missing_or_io(name, e))?;
    // Safety: SIOCGIFFLAGS succeeded, so the kernel wrote the flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags } as i32;

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
        ifindex,
        mac,
        mtu,
        up: flags & libc::IFF_UP != 0,
        running: flags & libc::IFF_RUNNING != 0,
        rx_queues,
    })
}

fn missing_or_io(name: &str, err: std::io::Error) -> DriverError {
    match err.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) => DriverError::InterfaceMissing {
            ifname: name.to_string(),
        },
        _ => DriverError::io(format!("querying interface {name:?}"), err),
    }
}

fn control_socket() -> Result<OwnedFd, DriverError> {
    // Safety: socket(2) with constant arguments has no memory-safety preconditions.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(DriverError::io(
            "creating a control socket",
            std::io::Error::last_os_error(),
        ));
    }
    // Safety: fd is a freshly created descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn new_ifreq(name: &CString) -> libc::ifreq {
    // Safety: ifreq is a plain C struct/union of integers and byte arrays; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // The caller checked the name is shorter than IFNAMSIZ, so the NUL terminator fits.
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    req
}

fn ioctl(sock: &OwnedFd, request: libc::Ioctl, req: &mut libc::ifreq) -> std::io::Result<()> {
    // Safety: `req` is a valid, exclusively borrowed ifreq for the duration of the call, and
    // every request used here (SIOCGIF*) reads the name and writes only within the ifreq.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), request, req as *mut libc::ifreq) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
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
