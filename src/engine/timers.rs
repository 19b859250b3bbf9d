//! Transport timers: the local ACK timeout and the RNR NAK timer table.
use std::time::Duration;

/// Local ACK timeout for the `timeout` attribute: 4.096 us x 2^timeout (IBTA 9.7.6.1.3,
/// C9-140); 0 means "infinite" (no timer).
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let ns = 4096u64 << timeout.min(31);
    Some(Duration::from_nanos(ns))
}

/// RNR NAK timer values in microseconds, indexed by the 5-bit code (IBTA table 45).
/// Code 0 is the longest, 655.36 ms.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR wait for a timer code (only the low 5 bits are used).
pub fn rnr_delay(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_US[(code & 31) as usize] as u64)
}
