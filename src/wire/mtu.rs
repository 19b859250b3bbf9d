//! The InfiniBand path MTU: a wire fact (the largest payload one packet carries), shared by
//! the engine, the drivers' link setup and the tools.
use std::fmt;

/// An InfiniBand path MTU: the largest payload one packet carries (headers excluded). The
/// discriminants are the `ibv_mtu` values (1 = 256 .. 5 = 4096), which perftest exchanges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes (rxe on a 1500-byte link).
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

/// Bytes of headers a RoCE v2 packet may add on top of its payload, subtracted from the link
/// MTU before choosing the IB MTU (rxe: `eth_mtu_int(mtu - 80)`: 20 IPv4 or 40 IPv6 + 8 UDP +
/// 12 BTH + up to 28 of extension headers + 4 ICRC, rounded up).
pub const ROCE_HEADER_ALLOWANCE: u32 = 80;

impl Mtu {
    /// All values, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// The payload size in bytes.
    pub fn bytes(self) -> u32 {
        256 << (self as u32 - 1)
    }

    /// The MTU for a byte count, if it is one of the five IB MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The `ibv_mtu` enum value (1 = 256 .. 5 = 4096).
    pub fn ibv_value(self) -> u8 {
        self as u8
    }

    /// The MTU of an `ibv_mtu` enum value (1..=5).
    pub fn from_ibv_value(value: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| *m as u32 == value)
    }

    /// The largest IB MTU whose packets fit a link of `link_mtu` bytes (IP MTU), or `None`
    /// when even 256 does not fit.
    pub fn for_link_mtu(link_mtu: u32) -> Option<Mtu> {
        let room = link_mtu.checked_sub(ROCE_HEADER_ALLOWANCE)?;
        Mtu::ALL.into_iter().rev().find(|m| m.bytes() <= room)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}
