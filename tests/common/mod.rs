//! Helpers shared by the integration tests (include with `mod common;`).
#![allow(dead_code)]

use std::path::PathBuf;

/// `true` if the test may go on; `false` (after a visible "SKIPPED" line) if it must skip
/// for lack of root. Under `XROCE_CI=1` a missing privilege fails the test instead.
pub fn privileged_or_skip(test: &str) -> bool {
    match xroce::netns::require_privileges(test) {
        Ok(go) => go,
        Err(msg) => panic!("{msg}"),
    }
}

/// Path of the `xroce` binary built for this test run.
pub fn xroce_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xroce"))
}
