//! Fuzzes sequences of frames against two engines with connected RC QPs and registered MRs:
//! each 8-byte step forges a request or response from boundary values (VAs 0, 1, u64::MAX
//! and near the MR's ends, lengths near the MTU, 2^31 and u32::MAX, PSNs at the 2^24 wrap,
//! R_Keys right and wrong), replays a frame from the link (duplicates, retries) or one with
//! another range at the same PSN, posts a real WR, or lets timers run
//! (`tests/common/hostile.rs`). Besides "no panic", every frame must be accounted for in the
//! counters, no WR may complete twice, and fresh QPs must still work afterwards.
#![no_main]

#[path = "../../tests/common/pair.rs"]
mod pair;
#[path = "../../tests/common/hostile.rs"]
mod hostile;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = hostile::run(data) {
        panic!("invariant broken: {e}");
    }
});
