//! Packet Sequence Numbers: 24-bit serial numbers (the BTH PSN, IBTA 9.2; used by
//! the reliable service, 9.7).
//!
//! A PSN wraps from `0xFF_FFFF` to `0`. Two PSNs are compared by the sign of their 24-bit
//! difference, so "after" is only meaningful within half the space (2^23). That is why `Psn`
//! has no `Ord`: a raw `<` on PSNs is wrong near the wrap, and the compiler refuses it.

use core::fmt;

/// A 24-bit Packet Sequence Number with serial-number arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 2^24 - 1.
    pub const MAX: Psn = Psn(Self::MASK);

    /// Makes a PSN from the low 24 bits of `value` (the high 8 bits are dropped).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The PSN as a number in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// Signed serial distance `later - self`, in `-2^23..2^23`.
    ///
    /// Positive when `later` comes after `self`. The difference is taken modulo 2^24 and
    /// sign-extended from bit 23 (the "`((a - b) << 8) as i32`" rule); two PSNs exactly 2^23
    /// apart give `-2^23`.
    #[inline]
    pub const fn distance_to(self, later: Psn) -> i32 {
        ((later.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// True when `self` comes strictly before `other` in serial order.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }

    /// True when `self` comes strictly after `other` in serial order.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        other.distance_to(self) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_masks_to_24_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(0xFF_FFFF), Psn::MAX);
    }

    #[test]
    fn add_and_sub_wrap() {
        assert_eq!(Psn::MAX.wrapping_add(1), Psn::ZERO);
        assert_eq!(Psn::ZERO.wrapping_sub(1), Psn::MAX);
        assert_eq!(Psn::new(0xFF_FFF0).wrapping_add(0x20), Psn::new(0x10));
    }

    #[test]
    fn distance_across_the_wrap() {
        assert_eq!(Psn::MAX.distance_to(Psn::ZERO), 1);
        assert_eq!(Psn::ZERO.distance_to(Psn::MAX), -1);
        assert_eq!(Psn::new(0xFF_FFFE).distance_to(Psn::new(3)), 5);
        assert!(Psn::new(3).is_after(Psn::new(0xFF_FFFE)));
        assert!(Psn::new(0xFF_FFFE).is_before(Psn::new(3)));
        assert!(!Psn::new(7).is_before(Psn::new(7)));
        assert!(!Psn::new(7).is_after(Psn::new(7)));
    }

    #[test]
    fn half_space_is_the_limit() {
        let a = Psn::new(100);
        assert_eq!(a.distance_to(a.wrapping_add(0x7F_FFFF)), 0x7F_FFFF);
        assert_eq!(a.distance_to(a.wrapping_add(0x80_0000)), -0x80_0000);
    }
}
