//! The addresses of a RoCEv2 endpoint as values: its Ethernet MAC and its GIDs (IBTA Annex
//! A17.4.1.1: on RoCE v2 a GID is an IPv6 address, an IPv4 one mapped into `::ffff:0:0/96`).
//! They live with the wire format, below everything that names an endpoint (the engine, the
//! CM, netdev's interface queries): looking them up on a host is netdev's job, not theirs.
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Parses `aa:bb:cc:dd:ee:ff`: six fields of one or two hex digits (either case),
    /// nothing else (no sign, no spaces, no other separator). The one MAC parser of the crate.
    pub fn parse(text: &str) -> Option<MacAddr> {
        let mut out = [0u8; 6];
        let mut parts = text.split(':');
        for byte in out.iter_mut() {
            let part = parts.next()?;
            // `from_str_radix` alone would also take a leading `+`.
            if part.is_empty() || part.len() > 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            *byte = u8::from_str_radix(part, 16).ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A 128-bit Global Identifier. On RoCE v2 it is an IPv6 address, IPv4 addresses being
/// IPv4-mapped (`::ffff:a.b.c.d`), IBTA Annex A17.4.1.1.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4 is mapped into `::ffff:0:0/96`).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for: IPv4 when it is IPv4-mapped, else IPv6.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for an IPv4-mapped GID (its packets use an IPv4 header).
    pub fn is_ipv4(&self) -> bool {
        self.0[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    }

    /// The 32 lowercase hex digits of the raw bytes (the form ibv_rc_pingpong exchanges).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits (optionally with ':' separators between groups).
    pub fn from_hex(text: &str) -> Option<Gid> {
        let digits: String = text.chars().filter(|c| *c != ':').collect();
        if digits.len() != 32 || !digits.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Gid(out))
    }
}

impl fmt::Display for Gid {
    /// The IPv6 presentation (`::ffff:198.18.0.1`, `fe80::1`), as `ibv_devinfo -v` shows it
    /// with the raw groups; we print the address form, which is what a reader recognises.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}
